use serde_json::json;

use super::merged::merge_capabilities;
use super::routed::{split, template_matches};

#[test]
fn names_split_at_the_first_separator() {
    assert_eq!(split("flights__search"), Some(("flights", "search")));
    assert_eq!(split("a__b__c"), Some(("a", "b__c")));
    assert_eq!(split("a___b"), Some(("a", "_b")));
    assert_eq!(split("search"), None);
    assert_eq!(split("__x"), None);
    assert_eq!(split("x__"), None);
}

#[test]
fn templates_match_segments_or_anything_with_an_operator() {
    assert!(template_matches("file:///{path}", "file:///a.txt"));
    assert!(!template_matches("file:///{path}", "file:///dir/a.txt"));
    assert!(template_matches("file:///{+path}", "file:///dir/a.txt"));
    assert!(template_matches(
        "test://static/resource/{id}",
        "test://static/resource/7"
    ));
    assert!(!template_matches(
        "test://static/resource/{id}",
        "test://other/7"
    ));
    assert!(template_matches("a://{x}/b/{y}", "a://1/b/2"));
    assert!(!template_matches("a://{x}/b/{y}", "a://1/c/2"));
    assert!(template_matches("plain://uri", "plain://uri"));
}

#[test]
fn capabilities_merge_as_a_union() {
    let mut into = json!({"tools": {"listChanged": false}});
    merge_capabilities(
        &mut into,
        &json!({"tools": {"listChanged": true}, "prompts": {}}),
    );
    merge_capabilities(&mut into, &json!({"logging": {}}));
    assert_eq!(
        into,
        json!({"tools": {"listChanged": true}, "prompts": {}, "logging": {}})
    );
}
