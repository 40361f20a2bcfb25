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

/// Where `needle` first appears in `text` (1-based line and column), or
/// 1:1: the location of a value that parsed but failed validation.
pub fn locate(text: &str, needle: &str) -> (usize, usize) {
    for (i, line) in text.lines().enumerate() {
        if let Some(c) = line.find(needle) {
            return (i + 1, c + 1);
        }
    }
    (1, 1)
}
