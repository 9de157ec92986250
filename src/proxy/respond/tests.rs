use super::check::read_failure;
use crate::error::ToolFailure;

#[test]
fn sdk_failure_texts_are_recognised() {
    assert_eq!(
        read_failure("Error executing tool explode", "explode"),
        (ToolFailure::Opaque, None)
    );
    assert_eq!(
        read_failure("Error executing tool explode: bad date", "explode"),
        (ToolFailure::Message, Some("bad date".into()))
    );
    assert_eq!(
        read_failure("Error calling tool 'explode': db down", "explode"),
        (ToolFailure::Message, Some("db down".into()))
    );
    assert_eq!(
        read_failure("cannot connect", "explode"),
        (ToolFailure::Message, Some("cannot connect".into()))
    );
    assert_eq!(read_failure("  ", "explode"), (ToolFailure::Message, None));
}

mod flow {
    use proptest::prelude::*;
    use serde_json::json;

    use super::super::recipient::quotes_server;
    use crate::error::{
        Rejection, RenderCtx, RpcError, ToolFailure, UpstreamFailure, UpstreamKind,
    };
    use crate::mcp::version::Era;

    fn kind(i: usize) -> UpstreamKind {
        [
            UpstreamKind::ToolFailed(ToolFailure::Message),
            UpstreamKind::ToolFailed(ToolFailure::Opaque),
            UpstreamKind::Error(RpcError {
                code: -32603,
                unknown_tool: false,
            }),
            UpstreamKind::Protocol,
            UpstreamKind::Refused(400),
            UpstreamKind::Unavailable,
            UpstreamKind::Timeout,
        ][i]
    }

    proptest! {
        /// Whatever failure a source tool's call ends in, when the message the
        /// client receives carries any of the server's words, the failure
        /// counts as read (its flow label is set): no label escapes through
        /// an error.
        #[test]
        fn a_failure_carrying_the_servers_words_counts_as_read(
            words in "[a-z]{16,24}",
            kind_index in 0usize..7,
            quoted: bool,
            relayed: bool,
            modern: bool,
        ) {
            let mut f = UpstreamFailure::new(kind(kind_index), "s", Some("t"), "the gateway's reason".into());
            if quoted {
                f.snippet = Some(format!("it said {words}"));
            }
            if relayed {
                f.relayed = Some(Box::new(json!({"code": -32000, "message": words})));
            }
            let read = quotes_server(&f);
            let era = if modern { Era::Modern } else { Era::Legacy };
            let id = json!(7);
            let cx = RenderCtx { id: Some(&id), era };
            let shown = Rejection::Upstream(f)
                .rpc_message(cx)
                .map(|m| m.to_string())
                .unwrap_or_default();
            if shown.contains(&words) {
                prop_assert!(read, "{shown}");
            }
        }
    }
}
