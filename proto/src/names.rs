//! Names that come from data — recording labels, alert labels, node names
//! in payloads — checked against the fleet's charset before they reach a
//! path, a process argument or a page.

/// The longest node name (a DNS name).
pub const MAX_NODE_NAME: usize = 253;

/// Whether `name` is a node name: 1 to 253 ASCII letters, digits, `.`, `-`
/// or `_`, not starting with `.` or `-` (so never `..`, a path, an option,
/// or markup). The error says what was expected and what was found.
pub fn check_node_name(name: &str) -> Result<(), String> {
    let shown: String = name.chars().take(80).flat_map(char::escape_debug).collect();
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if name.is_empty() || name.len() > MAX_NODE_NAME {
        return Err(format!(
            "node name \"{shown}\": expected 1 to {MAX_NODE_NAME} characters, found {}",
            name.chars().count()
        ));
    }
    if let Some(c) = name.chars().find(|c| !ok_char(*c)) {
        return Err(format!("node name \"{shown}\": expected only letters, digits, '.', '-' or '_', found {:?}", c));
    }
    if name.starts_with('.') || name.starts_with('-') {
        return Err(format!("node name \"{shown}\": expected a letter, digit or '_' first, found {:?}", &name[..1]));
    }
    Ok(())
}

/// The most characters a person's free text (a reason, a note) may have.
pub const MAX_FREE_TEXT_CHARS: usize = 1000;

/// What is wrong with a person's free text (a reason, a note) for the
/// audit and the pages, if anything: at most [`MAX_FREE_TEXT_CHARS`]
/// characters, and no control character but a newline (an escape sequence
/// in a reason would rewrite the screen of whoever reads it).
pub fn free_text_problem(field: &str, text: &str) -> Option<String> {
    let n = text.chars().count();
    if n > MAX_FREE_TEXT_CHARS {
        return Some(format!("{field}: expected at most {MAX_FREE_TEXT_CHARS} characters, found {n}"));
    }
    let (i, c) = text.chars().enumerate().find(|(_, c)| c.is_control() && *c != '\n')?;
    Some(format!(
        "{field}: expected no control character but a newline, found U+{:04X} at character {}",
        c as u32,
        i + 1
    ))
}

/// Whether `text` has a character a person can see: not only whitespace,
/// control characters (NUL …) or invisible format characters (zero-width
/// spaces and joiners, direction marks, the BOM, soft hyphens). A reason
/// that is "there" but shows as nothing is no reason.
pub fn has_visible_text(text: &str) -> bool {
    text.chars().any(|c| {
        !c.is_whitespace()
            && !c.is_control()
            && !matches!(c,
                '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
                | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}' | '\u{FFA0}'
                | '\u{E0000}'..='\u{E007F}')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_text_is_told_from_nothing() {
        for nothing in ["", "   ", "\0\0", "\u{200B}\u{200D}", "\u{FEFF}\t\n", "\u{2066}\u{2069}", "\u{00AD}"] {
            assert!(!has_visible_text(nothing), "{nothing:?}");
        }
        for some in ["not during the training run", " x ", "\u{200B}ok", "日本", "🚫"] {
            assert!(has_visible_text(some), "{some:?}");
        }
    }

    #[test]
    fn node_names_are_checked() {
        for ok in ["gpu-a1", "h100.rack3_17", "n0", "A"] {
            assert_eq!(check_node_name(ok), Ok(()), "{ok}");
        }
        for (bad, says) in [
            ("../../x", "found '/'"),
            ("/etc/nightshift", "found '/'"),
            ("..", "expected a letter"),
            (".hidden", "expected a letter"),
            ("-rf", "expected a letter"),
            ("", "found 0"),
            ("a b", "found ' '"),
            ("<script>", "found '<'"),
            ("nodé", "found 'é'"),
        ] {
            let e = check_node_name(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert!(check_node_name(&"x".repeat(254)).unwrap_err().contains("found 254"));
    }

    #[test]
    fn free_text_is_bounded_and_has_no_control_characters() {
        assert_eq!(free_text_problem("reason", "GPU 3 replaced\nand tested"), None);
        assert_eq!(
            free_text_problem("reason", "ok\u{1b}[2J"),
            Some("reason: expected no control character but a newline, found U+001B at character 3".into())
        );
        assert_eq!(
            free_text_problem("reason", &"x".repeat(1001)),
            Some("reason: expected at most 1000 characters, found 1001".into())
        );
        assert_eq!(free_text_problem("reason", &"é".repeat(1000)), None, "characters, not bytes");
    }
}
