//! YAML error locations: every loader (agent.yaml, policy.yaml, engine.yaml,
//! fleet.yaml, manifests, scenarios) reports `file:line:column: message`.

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

/// Where `needle` first appears in `text` as a key (`needle:` at the start
/// of a line, after `{`, `,` or a space), else anywhere (1-based line and
/// column), else 1:1: the location of a value that parsed but failed
/// validation. A key first, so `kinds` points at `kinds: []`, not at a
/// `name:` that happens to contain the word.
pub fn locate(text: &str, needle: &str) -> (usize, usize) {
    let key = format!("{needle}:");
    for (i, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(c) = line[from..].find(&key).map(|c| c + from) {
            let before = line[..c].chars().next_back();
            if before.is_none_or(|b| matches!(b, ' ' | '{' | ',' | '-' | '\t')) {
                return (i + 1, c + 1);
            }
            from = c + key.len();
        }
    }
    for (i, line) in text.lines().enumerate() {
        if let Some(c) = line.find(needle) {
            return (i + 1, c + 1);
        }
    }
    (1, 1)
}

#[cfg(test)]
mod tests {
    use super::locate;

    #[test]
    fn a_key_is_found_before_a_word_inside_a_value() {
        let text = "name: fault-no-kinds\ntrigger: {type: fault, kinds: []}\n";
        assert_eq!(locate(text, "kinds"), (2, 24));
        assert_eq!(locate(text, "no-kinds"), (1, 13));
        assert_eq!(locate("a: 1\nxkinds: 2\n", "kinds"), (2, 2), "not a key: the first occurrence");
        assert_eq!(locate("", "x"), (1, 1));
    }
}
