//! State under concurrency: gateway processes (the real binary) started at the
//! same moment on one fresh pin store and one audit store all start, serve,
//! and leave what each did in the shared files — round after round, because
//! the race ("database is locked", a migration applied twice) is a matter of
//! timing that one round may miss.

use crate::support;
use support::Config;

use std::time::Duration;

use futures_util::future::join_all;
use rusqlite::Connection;
use serde_json::json;
use support::process::Observed;
use support::upstreams::InProcess;
use support::{ALICE, ConfigFile, borrow, modern_call, modern_call_headers, raw_post};

/// Gateways started together in each round.
const GATEWAYS: usize = 6;
/// Rounds, each on fresh files.
const ROUNDS: usize = 10;

/// A gateway in front of `url` with the default stores: `portcullis-audit.db`
/// and `portcullis-pins.db` beside the configuration file.
fn config(url: &str) -> String {
    Config::new()
        .server("s", url)
        .set("timeout", "20s")
        .clients()
        .allow_all()
        .render()
}

fn count(path: &std::path::Path, sql: &str) -> i64 {
    let conn = Connection::open(path).expect("the store opens");
    conn.query_row(sql, [], |r| r.get(0)).expect(sql)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_started_together_on_one_store_all_start_and_share_it() {
    let upstream = InProcess::demo().await;
    for round in 0..ROUNDS {
        let file = ConfigFile::new(&config(&upstream.url));
        // Spawned in one poll: the processes open the fresh files together.
        // Each panics with the process's output if it does not start.
        let gateways = join_all((0..GATEWAYS).map(|_| Observed::start_file(file.path()))).await;

        for gateway in &gateways {
            let headers = modern_call_headers(ALICE, "echo");
            let r = raw_post(
                &gateway.url("s"),
                &borrow(&headers),
                modern_call(1, "echo", json!({"text": "hi"})),
            )
            .await;
            assert_eq!(r.status, 200, "round {round}: {}", r.text);
            assert_eq!(
                r.body["result"]["isError"],
                json!(null),
                "round {round}: {}",
                r.text
            );
        }
        for gateway in gateways {
            assert!(
                gateway.terminate(Duration::from_secs(20)).await,
                "round {round}: a clean stop"
            );
        }

        let audit = file.dir().join("portcullis-audit.db");
        let pins = file.dir().join("portcullis-pins.db");
        assert_eq!(
            count(
                &audit,
                "SELECT COUNT(*) FROM events WHERE method = 'tools/call'"
            ),
            GATEWAYS as i64,
            "round {round}: every gateway's call is in the one audit store"
        );
        for store in [&audit, &pins] {
            let applied = count(store, "SELECT COUNT(*) FROM schema_migrations");
            let distinct = count(
                store,
                "SELECT COUNT(DISTINCT version) FROM schema_migrations",
            );
            assert_eq!(
                applied,
                distinct,
                "round {round}: {} migrated once per version",
                store.display()
            );
        }
        assert!(
            count(&pins, "SELECT COUNT(*) FROM pins WHERE name = 'echo'") == 1,
            "round {round}: the tool is pinned once"
        );
    }
}
