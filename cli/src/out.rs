//! Terminal output: aligned tables, colour only on a terminal (and never
//! with `NO_COLOR`), JSON on request.

use std::io::{IsTerminal, Write};

/// `println!` for command output. A reader that went away (`| head`) ends
/// the process quietly with exit 0, as SIGPIPE does for C tools, instead of
/// the panic `println!` raises on a closed pipe.
macro_rules! outln {
    () => { $crate::out::write_out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` for command output (see [`outln!`]).
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::write_out(format_args!($($arg)*)) };
}

/// Text from the server made safe for a terminal: every control character
/// but a newline (an escape sequence in a reason could clear the screen or
/// rewrite a line) shown as `\u{1b}`.
pub fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() && c != '\n' { c.escape_unicode().to_string() } else { c.to_string() })
        .collect()
}

/// Write to stdout; on a broken pipe, exit 0; on another error, say so on
/// stderr and exit 1.
pub fn write_out(args: std::fmt::Arguments<'_>) {
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|_| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        let _ = writeln!(std::io::stderr(), "error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// Write bytes to stdout with the same rule (completion scripts).
pub fn write_bytes(bytes: &[u8]) {
    write_out(format_args!("{}", String::from_utf8_lossy(bytes)));
}

/// How to print.
#[derive(Debug, Clone, Copy)]
pub struct Out {
    pub color: bool,
    pub json: bool,
    pub tty: bool,
}

impl Out {
    pub fn new(json: bool, no_color: bool) -> Out {
        let tty = std::io::stdout().is_terminal();
        let color = tty && !no_color && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        Out { color, json, tty }
    }

    fn paint(&self, code: &str, s: &str) -> String {
        if self.color { format!("\x1b[{code}m{s}\x1b[0m") } else { s.to_string() }
    }
    pub fn green(&self, s: &str) -> String {
        self.paint("32", s)
    }
    pub fn red(&self, s: &str) -> String {
        self.paint("31", s)
    }
    pub fn yellow(&self, s: &str) -> String {
        self.paint("33", s)
    }
    pub fn blue(&self, s: &str) -> String {
        self.paint("34", s)
    }
    pub fn dim(&self, s: &str) -> String {
        self.paint("2", s)
    }
    pub fn bold(&self, s: &str) -> String {
        self.paint("1", s)
    }

    /// Colour for a run outcome or state.
    pub fn status(&self, s: &str) -> String {
        match s {
            "succeeded" | "applied" | "ok" | "pass" => self.green(s),
            "failed" | "interrupted" | "FAIL" | "refused" => self.red(s),
            "timed_out" | "pending_approval" | "queued" | "dry_run" | "needs_person" => self.yellow(s),
            "running" => self.blue(s),
            _ => s.to_string(),
        }
    }

    /// Print a table: a header row and rows, columns padded to fit.
    pub fn table(&self, header: &[&str], rows: &[Vec<String>]) {
        let n = header.len();
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for r in rows {
            for (i, c) in r.iter().enumerate().take(n) {
                widths[i] = widths[i].max(visible_len(c));
            }
        }
        let line = |cells: Vec<String>| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                s.push_str(c);
                if i + 1 < n {
                    s.push_str(&" ".repeat(widths[i].saturating_sub(visible_len(c)) + 2));
                }
            }
            outln!("{}", s.trim_end());
        };
        line(header.iter().map(|h| self.bold(h)).collect());
        for r in rows {
            line(r.clone());
        }
    }
}

/// Length without ANSI escapes.
fn visible_len(s: &str) -> usize {
    let mut n = 0;
    let mut esc = false;
    for c in s.chars() {
        match (esc, c) {
            (false, '\x1b') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, _) => n += 1,
        }
    }
    n
}

/// `2026-11-30 03:04:05Z`.
pub fn time(ms: i64) -> String {
    let s = nightshift_engine::api::format_rfc3339_ms(ms);
    format!("{} {}Z", &s[..10], &s[11..19])
}

/// Shorten to `n` characters.
pub fn clip(s: &str, n: usize) -> String {
    let s = clean(s);
    if s.chars().count() <= n { s } else { format!("{}…", s.chars().take(n.saturating_sub(1)).collect::<String>()) }
}

/// [`clean`] on every string in `v` (a record's data from the server).
pub fn clean_json(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(clean(s)),
        Value::Array(a) => Value::Array(a.iter().map(clean_json).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (clean(k), clean_json(v))).collect()),
        other => other.clone(),
    }
}

/// Percent-encode a query value or path segment (RFC 3986 unreserved kept).
pub fn urlencode(s: &str) -> String {
    const SET: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
    percent_encoding::utf8_percent_encode(s, SET).to_string()
}

/// A span of seconds as people read it: `45 s`, `12 min`, `3 h 20 min`,
/// `2 d 4 h`.
pub fn secs(s: i64) -> String {
    let s = s.max(0);
    match s {
        0..=119 => format!("{s} s"),
        120..=3599 => format!("{} min", s / 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod secs_tests {
    #[test]
    fn spans_read_like_a_person_says_them() {
        for (s, want) in [(-5, "0 s"), (45, "45 s"), (720, "12 min"), (12_000, "3 h 20 min"), (187_200, "2 d 4 h")] {
            assert_eq!(super::secs(s), want, "{s}");
        }
    }
}

#[cfg(test)]
mod clean_tests {
    use super::{clean, clean_json, clip};

    #[test]
    fn control_characters_from_the_server_are_shown_not_obeyed() {
        assert_eq!(clean("wrong node\u{1b}[2J\r ok\nnext"), "wrong node\\u{1b}[2J\\u{d} ok\nnext");
        assert_eq!(clean("GPU 3 at 91 °C"), "GPU 3 at 91 °C");
        assert_eq!(clip("ab\u{1b}[2J", 80), "ab\\u{1b}[2J");
        let v = clean_json(&serde_json::json!({"reason": "x\u{7}", "n": [1, "\u{1b}"]}));
        assert_eq!(v, serde_json::json!({"reason": "x\\u{7}", "n": [1, "\\u{1b}"]}));
    }
}
