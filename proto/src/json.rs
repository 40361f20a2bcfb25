//! Strict JSON: an object with the same key twice is refused, at any depth.
//! `serde_json` keeps the last of two equal keys when it reads into a map
//! or a `Value` (a request's `args`, an API body's `params`), so
//! `{"watts": 600, "watts": 100}` would mean whatever the last one says
//! while a reviewer reads the first. Checked once over the raw bytes before
//! the real parse.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Refuse `bytes` if any object in it has a key twice: the error names the
/// key and where (line and column, from the parser).
pub fn check_no_duplicate_keys(bytes: &[u8]) -> Result<(), String> {
    let mut d = serde_json::Deserializer::from_slice(bytes);
    match Walk.deserialize(&mut d) {
        Ok(()) => Ok(()),
        // Only our own refusal: malformed JSON is the real parser's to name.
        Err(e) if e.to_string().starts_with("duplicate key") => Err(e.to_string()),
        Err(_) => Ok(()),
    }
}

/// Walks any JSON value, refusing a repeated key.
struct Walk;

impl<'de> DeserializeSeed<'de> for Walk {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(Walk)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Walk)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("duplicate key {key:?}: expected each key once in an object")));
            }
            map.next_value_seed(Walk)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_key_is_refused_at_any_depth_and_named() {
        for (text, bad) in [
            (r#"{"a": 1, "b": {"c": [1, {"d": 2}]}}"#, None),
            (r#"{"a": 1, "a": 2}"#, Some(("\"a\"", "line 1"))),
            (
                r#"{"op": "x", "args": {"watts": 600,
                 "watts": 100}}"#,
                Some(("\"watts\"", "line 2")),
            ),
            (r#"[{"k": 1}, {"k": 2, "k": 3}]"#, Some(("\"k\"", "column"))),
            (r#"{"a": "\u0061", "\u0061": 1}"#, Some(("\"a\"", "line 1"))),
            ("not json", None),
        ] {
            let r = check_no_duplicate_keys(text.as_bytes());
            match bad {
                None => assert!(r.is_ok(), "{text}: {r:?}"),
                Some((key, at)) => {
                    let e = r.unwrap_err();
                    assert!(e.starts_with(&format!("duplicate key {key}")) && e.contains(at), "{text}: {e}");
                }
            }
        }
    }
}
