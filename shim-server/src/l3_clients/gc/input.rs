//! A CNI GC request's valid lists read straight from its text into pairs.
//!
//! libcni 1.2.3 and later send the list under both keys ([`VALID_KEY`], [`LEGACY_KEY`]): at
//! 10,000 pods two lists of ~9,750 objects. Parsed whole into a `serde_json::Value`, then
//! into 19,500 pairs, then a set, the request took dipamd's RSS from 58 to 74 MiB as it
//! arrived (docs/performance.md, run 39). Here the config is split at its top level: the
//! two lists stay text borrowed from the request, the rest is re-encoded for the core to
//! parse as it parses every config. Each list is read entry by entry into pairs (each entry
//! borrowing from the text until it is checked), and a second list with the same text as
//! the first is not read again: its pairs are in already.
//!
//! Only a request this path takes whole goes through it ([`read`] answers `None` for any
//! other, the refusals included): the caller then reads it as every request was read before
//! (the config parsed whole, [`super::valid_input`]), so every refusal names the same entry
//! and key in the same words.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{LEGACY_KEY, VALID_KEY, ValidInput};
use crate::l1_leaves::validate;

/// The request's config without the two lists (re-encoded, each other member's text as
/// sent), and its valid list read into pairs; `None` when this path does not take it: not
/// one JSON object, or a list it would refuse (see the module doc).
pub fn read(stdin: &[u8]) -> Option<(Vec<u8>, ValidInput)> {
    let Top(members) = serde_json::from_slice(stdin).ok()?;
    // As a `Value` reads a key given twice: the last one counts.
    let mut lists: [Option<&RawValue>; 2] = [None, None];
    let mut rest: Vec<(String, &RawValue)> = Vec::with_capacity(members.len());
    for (k, v) in members {
        match k.as_str() {
            VALID_KEY => lists[0] = Some(v),
            LEGACY_KEY => lists[1] = Some(v),
            _ => rest.push((k, v)),
        }
    }
    let input = valid_input(lists)?;
    let config = serde_json::to_vec(&Members(&rest)).ok()?;
    Some((config, input))
}

/// [`super::valid_input`] over the lists' text: the union of both keys' lists, a null key
/// counting as absent when the other carries a list.
fn valid_input(lists: [Option<&RawValue>; 2]) -> Option<ValidInput> {
    let mut null = false;
    let mut list: Option<Vec<(String, String)>> = None;
    let mut read: Option<&str> = None;
    for raw in lists.into_iter().flatten() {
        let text = raw.get();
        if text == "null" {
            null = true;
            continue;
        }
        // libcni's second copy of the same list: every pair of it is in already.
        if read == Some(text) {
            continue;
        }
        list.get_or_insert_with(Vec::new).extend(pairs(raw)?);
        read = Some(text);
    }
    Some(match list {
        Some(l) => ValidInput::List(l),
        None if null => ValidInput::Null,
        None => ValidInput::Absent,
    })
}

/// One list's pairs, or `None` if any entry is not exactly two strings `containerID` and
/// `ifname` that pass the identifier rules (what [`super::parse_list`] accepts).
fn pairs(raw: &RawValue) -> Option<Vec<(String, String)>> {
    let entries: Vec<&RawValue> = serde_json::from_str(raw.get()).ok()?;
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        // A derived struct also reads a list of its fields' values: only an object is an entry.
        if !e.get().starts_with('{') {
            return None;
        }
        let Entry {
            container_id,
            ifname,
        } = serde_json::from_str(e.get()).ok()?;
        if validate::container_id(&container_id).is_err() || validate::ifname(&ifname).is_err() {
            return None;
        }
        out.push((container_id.into_owned(), ifname.into_owned()));
    }
    Some(out)
}

/// An entry as libcni writes it; a key given twice, or any other key, is not taken here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry<'a> {
    #[serde(rename = "containerID", borrow)]
    container_id: Cow<'a, str>,
    #[serde(borrow)]
    ifname: Cow<'a, str>,
}

/// A JSON object's members in order, each value's text as sent.
struct Top<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Top<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Top<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Top<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = m.next_key::<String>()? {
                    out.push((k, m.next_value::<&'de RawValue>()?));
                }
                Ok(Top(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// [`Top`]'s members written back as one object.
struct Members<'a, 'b>(&'b [(String, &'a RawValue)]);

impl Serialize for Members<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

#[cfg(test)]
mod tests;
