//! YAML error locations: every loader (agent.yaml, policy.yaml, engine.yaml,
//! fleet.yaml, manifests, scenarios) reports `file:line:column: message`.
//!
//! Parse errors carry serde_yaml's own position. A value that parsed but
//! failed validation is located by walking the document with the parser
//! ([`locate`]): the position is the parser's mark of the key itself, so a
//! comment or a value that contains the word, or the same key elsewhere in
//! the file, is never taken for it.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Deserialize `text` as `T`, refusing a key given twice in any mapping
/// (serde_yaml lets the last one win in a map: a second `nccl-env:` under
/// `configs:` pointing at another file would replace the first silently).
/// The document is read as `T` (the type's own errors first), then as a
/// YAML value, which refuses a duplicate with its location.
pub fn from_str<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_yaml::Error> {
    let t = serde_yaml::from_str(text)?;
    serde_yaml::from_str::<serde_yaml::Value>(text)?;
    Ok(t)
}

/// Line, column and message of a YAML error, without serde_yaml's trailing
/// " at line L column C" (the location goes in front instead).
pub fn error_parts(e: &serde_yaml::Error) -> (usize, usize, String) {
    let (line, column) = e.location().map(|l| (l.line(), l.column())).unwrap_or((1, 1));
    let mut msg = e.to_string();
    if let Some(i) = msg.rfind(" at line ") {
        msg.truncate(i);
    }
    (line, column, msg)
}

/// Where a key is in `text` (1-based line and column, from the parser), or
/// 1:1 when it is not there. `needle` is a key (`follow_ms`: the first key
/// of that name anywhere, in document order) or a dotted path from the top
/// (`audit.postgres.follow_ms`; a list item is `*` or its index, as in
/// `nodes.3.name`). When no key matches, the first scalar value equal to
/// `needle` (a metric or runbook name that is not known). Comments and text
/// inside other values never match.
pub fn locate(text: &str, needle: &str) -> (usize, usize) {
    locate_key(text, needle).or_else(|| locate_value(text, needle)).unwrap_or((1, 1))
}

/// The first scalar value equal to `value` (not a key), by the parser.
pub fn locate_value(text: &str, value: &str) -> Option<(usize, usize)> {
    let walk = Walk { want: &[value], anywhere: true, value: true, path: Rc::default(), found: Rc::default() };
    let found = walk.found.clone();
    match walk.deserialize(serde_yaml::Deserializer::from_str(text)) {
        Err(e) if found.get() => e.location().map(|l| (l.line(), l.column())),
        _ => None,
    }
}

/// [`locate`], `None` when no such key is in the document.
pub fn locate_key(text: &str, needle: &str) -> Option<(usize, usize)> {
    let want: Vec<&str> = needle.split('.').collect();
    let walk = Walk { want: &want, anywhere: want.len() == 1, value: false, path: Rc::default(), found: Rc::default() };
    let found = walk.found.clone();
    // The walk stops with an error at the key: its location is the key's
    // mark (serde_yaml marks an error with the event it was raised at).
    match walk.deserialize(serde_yaml::Deserializer::from_str(text)) {
        Err(e) if found.get() => e.location().map(|l| (l.line(), l.column())),
        _ => None,
    }
}

/// The error a walk stops with when it reaches the key.
const FOUND: &str = "nightshift: the key is here";

#[derive(Clone)]
struct Walk<'a> {
    want: &'a [&'a str],
    anywhere: bool,
    /// Looking for a scalar value equal to `want[0]`, not a key.
    value: bool,
    path: Rc<RefCell<Vec<String>>>,
    found: Rc<Cell<bool>>,
}

impl Walk<'_> {
    fn matches(&self, key: &str) -> bool {
        if self.value {
            return false;
        }
        if self.anywhere {
            return key == self.want[0];
        }
        let path = self.path.borrow();
        if path.len() + 1 != self.want.len() {
            return false;
        }
        path.iter()
            .map(String::as_str)
            .chain(std::iter::once(key))
            .zip(self.want.iter())
            .all(|(have, want)| have == *want || (*want == "*" && have.parse::<usize>().is_ok()))
    }
}

impl Walk<'_> {
    /// A scalar value: the one looked for stops the walk here.
    fn scalar<E: de::Error>(&self, v: &str) -> Result<(), E> {
        if self.value && v == self.want[0] {
            self.found.set(true);
            return Err(E::custom(FOUND));
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.scalar(&v.to_string())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.scalar(&v.to_string())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.scalar(&v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.scalar(&v.to_string())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.scalar(v)
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        // A tagged value (`!Tag x`): walk what it tags.
        let (_, v) = data.variant_seed(Ignore)?;
        de::VariantAccess::newtype_variant_seed(v, self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        for i in 0usize.. {
            self.path.borrow_mut().push(i.to_string());
            let next = seq.next_element_seed(self.clone());
            self.path.borrow_mut().pop();
            if next?.is_none() {
                break;
            }
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(Key(self.clone()))? {
            self.path.borrow_mut().push(key);
            let r = map.next_value_seed(self.clone());
            self.path.borrow_mut().pop();
            r?;
        }
        Ok(())
    }
}

/// A map key's text; the key looked for stops the walk here, while the
/// key's own event is current.
struct Key<'a>(Walk<'a>);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        let walk = self.0;
        d.deserialize_any(KeyText(move |text: String| {
            if walk.matches(&text) {
                walk.found.set(true);
                return Err(FOUND);
            }
            Ok(text)
        }))
    }
}

/// Reads a key as text (any scalar; a complex key reads as empty) and
/// hands it to the check, whose refusal becomes the error.
struct KeyText<F>(F);

impl<F: FnOnce(String) -> Result<String, &'static str>> KeyText<F> {
    fn take<E: de::Error>(self, text: String) -> Result<String, E> {
        (self.0)(text).map_err(E::custom)
    }
}

impl<'de, F: FnOnce(String) -> Result<String, &'static str>> Visitor<'de> for KeyText<F> {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        self.take(v.to_string())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        self.take(v.to_string())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        self.take(v.to_string())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        self.take(v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        self.take(v.to_string())
    }
    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        self.take(String::new())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<String, A::Error> {
        while seq.next_element::<de::IgnoredAny>()?.is_some() {}
        Ok(String::new())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        while map.next_entry::<de::IgnoredAny, de::IgnoredAny>()?.is_some() {}
        Ok(String::new())
    }
}

struct Ignore;

impl<'de> DeserializeSeed<'de> for Ignore {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(de::IgnoredAny).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::{locate, locate_key};

    /// Regression (issue 27 item 9: an `engine.yaml` whose first-line
    /// comment contained "backend" blamed `engine.yaml:1:52` for an error
    /// on line 9): keys are found by the parser, never in comments or
    /// values, and a dotted path picks one of several keys of a name.
    #[test]
    fn keys_are_found_by_the_parser_not_by_searching_the_text() {
        let text = "# engine.yaml: the audit backend is sled by default\n\
                    name: backend-box # backend: here is a comment\n\
                    description: \"backend: not a key\"\n\
                    nodes:\n\
                    \x20 - {name: a, backend: sim}\n\
                    \x20 - name: b\n\
                    \x20   backend: nvml\n\
                    audit:\n\
                    \x20 backend: postgres\n\
                    \x20 postgres: {url_file: u, follow_ms: 5}\n";
        assert_eq!(locate(text, "backend"), (5, 15), "the first real key, in document order");
        assert_eq!(locate(text, "audit.backend"), (9, 3));
        assert_eq!(locate(text, "nodes.1.backend"), (7, 5));
        assert_eq!(locate(text, "nodes.*.name"), (5, 6));
        assert_eq!(locate(text, "audit.postgres.follow_ms"), (10, 27));
        assert_eq!(locate(text, "follow_ms"), (10, 27));
        assert_eq!(locate_key(text, "audit.nothing"), None);
        assert_eq!(locate(text, "description"), (3, 1));
        // Repeated keys: the first, by the parser's order.
        assert_eq!(locate("a: {kinds: [1]}\nkinds: []\n", "kinds"), (1, 5));
        assert_eq!(locate("a: {kinds: [1]}\nkinds: []\n", "kinds.0"), (1, 1), "a path that is no key: 1:1");
        assert_eq!(locate("", "x"), (1, 1));
        assert_eq!(locate("not: [valid", "not"), (1, 1), "malformed YAML: the parser's own error says where");
    }

    #[test]
    fn a_key_is_found_before_a_word_inside_a_value() {
        let text = "name: fault-no-kinds\ntrigger: {type: fault, kinds: []}\n";
        assert_eq!(locate(text, "kinds"), (2, 24));
        assert_eq!(locate(text, "trigger.kinds"), (2, 24));
        assert_eq!(locate_key(text, "no-kinds"), None, "a word in a value is no key");
        assert_eq!(locate(text, "fault"), (2, 17), "no such key: the value");
        assert_eq!(locate(text, "fault-no-kinds"), (1, 7));
        assert_eq!(locate("# gpu.temp\nm: {metric: gpu.temp}\n", "gpu.temp"), (2, 13), "not the comment");
    }
}
