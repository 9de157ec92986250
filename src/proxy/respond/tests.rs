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
