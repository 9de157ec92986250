//! `[sanitize]` and `[[sanitize.exemptions]]` → [`SanitizeSettings`].
//!
//! Invariants: an exemption names an existing server and only checks that
//! may be turned off ([`SKIPPABLE`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::super::model::ServerSettings;
use super::super::raw::RawConfig;
use crate::policy::glob::Glob;
use crate::sanitize::{ArgumentScan, Exemption, SanitizeSettings, SecretsAction};

use super::{Ctx, Result, SKIPPABLE};

impl Ctx<'_> {
    pub(super) fn sanitize(
        &self,
        raw: &RawConfig,
        servers: &BTreeMap<String, Arc<ServerSettings>>,
    ) -> Result<SanitizeSettings> {
        let s = &raw.sanitize;
        let server_names: BTreeSet<String> = servers.keys().cloned().collect();
        let mut exemptions = Vec::new();
        for (i, e) in s.exemptions.iter().enumerate() {
            exemptions.push(self.exemption(
                e,
                &format!("sanitize.exemptions[{i}]"),
                &server_names,
            )?);
        }
        let mut patterns = Vec::new();
        let mut names = BTreeSet::new();
        for (i, p) in s.patterns.iter().enumerate() {
            let key = format!("sanitize.patterns[{i}]");
            if p.name.get_ref().is_empty() || !names.insert(p.name.get_ref().clone()) {
                return Err(self.fail(
                    Some(p.name.span()),
                    &format!("{key}.name"),
                    "expected a unique, non-empty name (it appears in `[REDACTED:<name>]`)",
                ));
            }
            let re = regex::RegexBuilder::new(p.regex.get_ref())
                .size_limit(1 << 20)
                .build()
                .map_err(|e| {
                    self.fail(
                        Some(p.regex.span()),
                        &format!("{key}.regex"),
                        format!("not a valid regular expression: {e}"),
                    )
                })?;
            patterns.push((p.name.get_ref().clone(), re));
        }
        Ok(SanitizeSettings {
            ansi: s.ansi.unwrap_or(true),
            invisible_unicode: s.invisible_unicode.unwrap_or(true),
            secrets: self.one_of(
                s.secrets.as_ref(),
                "sanitize.secrets",
                &[
                    ("off", SecretsAction::Off),
                    ("redact", SecretsAction::Redact),
                    ("block", SecretsAction::Block),
                ],
                SecretsAction::Redact,
            )?,
            max_output_bytes: self.size(
                s.max_output_bytes.as_ref(),
                "sanitize.max_output_bytes",
                256 * 1024,
                1024,
                64 << 20,
            )?,
            patterns,
            arguments: self.one_of(
                s.arguments.as_ref(),
                "sanitize.arguments",
                &[("off", ArgumentScan::Off), ("block", ArgumentScan::Block)],
                ArgumentScan::Block,
            )?,
            exemptions,
        })
    }

    fn exemption(
        &self,
        raw: &super::super::raw::RawExemption,
        key: &str,
        servers: &BTreeSet<String>,
    ) -> Result<Exemption> {
        let servers = match &raw.servers {
            Some(list) => self.references(list, &format!("{key}.servers"), servers, "servers")?,
            None => vec![Glob::new("*").map_err(|e| self.fail(None, key, e.to_string()))?],
        };
        if raw.tools.get_ref().is_empty() {
            return Err(self.fail(
                Some(raw.tools.span()),
                &format!("{key}.tools"),
                "the list is empty, so the exemption can never apply; name the tools (globs such as \"read_*\")",
            ));
        }
        let tools = self.globs(Some(raw.tools.get_ref()), &format!("{key}.tools"))?;
        if raw.skip.get_ref().is_empty() {
            return Err(self.fail(
                Some(raw.skip.span()),
                &format!("{key}.skip"),
                format!(
                    "the list is empty; name what to turn off: {}",
                    SKIPPABLE.join(", ")
                ),
            ));
        }
        let mut skip = crate::sanitize::Skip::default();
        for (j, item) in raw.skip.get_ref().iter().enumerate() {
            let flag = match item.get_ref().as_str() {
                "ansi" => &mut skip.ansi,
                "invisible_unicode" => &mut skip.invisible_unicode,
                "secrets" => &mut skip.secrets,
                "max_output_bytes" => &mut skip.max_output_bytes,
                "arguments" => &mut skip.arguments,
                other => {
                    let hint = match crate::policy::closest(other, SKIPPABLE, 1).first() {
                        Some(best) => format!("did you mean {best:?}? "),
                        None => String::new(),
                    };
                    return Err(self.fail(
                        Some(item.span()),
                        &format!("{key}.skip[{j}]"),
                        format!(
                            "{other:?} is not a sanitizer action; {hint}expected one of {}",
                            SKIPPABLE
                                .iter()
                                .map(|s| format!("{s:?}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
            };
            *flag = true;
        }
        Ok(Exemption {
            servers,
            tools,
            skip,
        })
    }
}
