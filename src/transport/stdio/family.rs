//! A stdio server's descendants, found from `/proc` while its process tree
//! is whole, so that those that left its process group (`setsid`, a daemon's
//! own group) are ended with it.
//!
//! Place: under [`super::child`], which takes the snapshot when a process
//! life ends, before the process is asked to stop (once it exits, its
//! children are orphans of init and no longer traceable to it), and kills
//! what the snapshot holds once the process is gone.
//!
//! Invariants: a process is killed only if it still has the start time it
//! had in the snapshot (a reused pid is left alone); the snapshot holds
//! descendants only, never the gateway or a process outside the tree.
//! Off Linux, and where `/proc` cannot be read, the snapshot is empty and
//! only the process group is killed, as before.

/// A process of the tree: its pid and its start time (clock ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Member {
    pid: i32,
    start: u64,
}

/// Every descendant of `root` (not `root` itself), as they are now.
pub(super) fn descendants(root: u32) -> Vec<Member> {
    let Ok(root) = i32::try_from(root) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let processes: Vec<(Member, i32)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| stat(pid).map(|(ppid, start)| (Member { pid, start }, ppid)))
        .collect();
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for (member, ppid) in &processes {
            if *ppid == parent && member.pid != root && !found.contains(member) {
                found.push(*member);
                parents.push(member.pid);
            }
        }
    }
    found
}

/// Kills every member of `family` that is still the process the snapshot saw.
pub(super) fn kill(family: &[Member]) {
    for member in family {
        if stat(member.pid).is_some_and(|(_, start)| start == member.start)
            && let Some(pid) = rustix::process::Pid::from_raw(member.pid)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// The parent pid and start time of `pid`, from `/proc/<pid>/stat`.
fn stat(pid: i32) -> Option<(i32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the last `)`.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    // After the name: state (3), ppid (4), … starttime (22).
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_of_this_process_is_a_descendant_and_is_killed() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep runs");
        let family = descendants(std::process::id());
        let pid = i32::try_from(child.id()).expect("pid");
        assert!(family.iter().any(|m| m.pid == pid), "{family:?}");
        kill(
            &family
                .iter()
                .copied()
                .filter(|m| m.pid == pid)
                .collect::<Vec<_>>(),
        );
        let status = child.wait().expect("waited");
        assert!(!status.success(), "killed: {status}");
    }
}
