use std::num::NonZeroU32;

use std::time::Duration;

use http::{StatusCode, header};

use super::refusals::wait_text;
use super::*;
use crate::mcp::version::Era;
use crate::policy::{Rate, RateKey};

fn limited(key: RateKey, shared_by: &[&str], retry_after: Duration) -> RateLimited {
    RateLimited {
        subject: Limited::Tool("echo".into()),
        client: "bob".into(),
        limit: Some(Limit {
            rule: 0,
            rate: Rate {
                burst: NonZeroU32::new(3).expect("nonzero"),
                per_second: 0.05,
                key,
            },
            shared_by: shared_by.iter().map(|s| s.to_string()).collect(),
        }),
        retry_after,
    }
}

#[test]
fn rate_limit_texts() {
    let wait = Duration::from_millis(7_400);
    assert_eq!(
        limited(RateKey::ClientTool, &["echo"], wait).text(),
        "Rate limit for `echo` reached for client `bob`: 3 calls, then 1 every 20 s. Retry after 7.4 s."
    );
    assert_eq!(
        limited(RateKey::Client, &["echo"], wait).text(),
        "Rate limit for `echo` reached for client `bob`: 3 calls, then 1 every 20 s. Retry after 7.4 s."
    );
    assert_eq!(
        limited(RateKey::Client, &["echo", "search_*"], wait).text(),
        "Rate limit for `echo` reached for client `bob`: 3 calls, then 1 every 20 s, counted together for `echo`, `search_*`. Retry after 7.4 s."
    );
    assert_eq!(
        limited(RateKey::All, &["*"], wait).text(),
        "Rate limit for `echo` reached: 3 calls, then 1 every 20 s, shared by all clients. Retry after 7.4 s."
    );
    let detail = limited(
        RateKey::ClientTool,
        &["echo"],
        Duration::from_nanos(7_300_000_001),
    )
    .detail();
    assert_eq!(detail["retry_after_ms"], 7_301, "rounded up");
    assert_eq!(detail["limit"]["key"], "client+tool");
    assert_eq!(detail["limit"]["rule"], "rules[0]");
    let down = RateLimited {
        limit: None,
        ..limited(RateKey::All, &[], Duration::from_secs(1))
    };
    assert!(
        down.text()
            .starts_with("The rate limit for `echo` cannot be checked right now")
    );
    assert_eq!(down.detail()["reason"], "backend_unavailable");
}

#[test]
fn waits_are_rounded_up_for_a_reader() {
    let t = |ns: u64| wait_text(Duration::from_nanos(ns));
    assert_eq!(t(1), "0.1 s");
    assert_eq!(t(7_300_000_001), "7.4 s");
    assert_eq!(t(20_000_000_000), "20 s");
    assert_eq!(t(59_950_000_000), "1 min");
    assert_eq!(t(125_000_000_000), "2 min 5 s");
    assert_eq!(t(120_000_000_000), "2 min");
    assert_eq!(t(3_600_000_000_000), "1 h");
    assert_eq!(t(5_400_000_000_001), "1 h 31 min");
}

#[test]
fn a_tool_refusal_has_retry_after_in_whole_seconds() {
    let cx = RenderCtx {
        id: None,
        era: Era::Legacy,
    };
    let r = Rejection::RateLimited(limited(
        RateKey::ClientTool,
        &["echo"],
        Duration::from_millis(7_400),
    ))
    .into_response(cx);
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[header::RETRY_AFTER], "8");
}
