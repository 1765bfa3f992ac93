//! Text that tenant code wrote (a ServerApp's exception, its log, the names of its output files),
//! made safe before the hub stores or prints it: bounded, with terminal escape sequences and other
//! control characters removed, so no app can make a status write fail (an object over the
//! apiserver's size limit) or drive the terminal of whoever reads `flower-hub run logs`.

/// The most bytes of Flower's `details` (a ServerApp's exception) kept in a FlowerRun's status.
pub const MAX_DETAILS: usize = 4096;
/// The most bytes of one log line kept in a FlowerRun's status.
pub const MAX_LOG_LINE: usize = 1000;
/// The most bytes of an output file's path kept in a FlowerRun's status.
pub const MAX_OUTPUT_PATH: usize = 512;

/// `text` with ANSI escape sequences removed, every other control character but newline and tab
/// replaced by `�`, and cut to at most `max` bytes (at a character boundary) with `… (N bytes
/// cut)` appended when it was longer (the note itself is not counted).
pub fn bounded(text: &str, max: usize) -> String {
    let clean = strip_control(text, true);
    cut(clean, max)
}

/// [`bounded`] for one line: newlines and tabs are replaced too.
pub fn bounded_line(text: &str, max: usize) -> String {
    let clean = strip_control(text, false);
    cut(clean, max)
}

/// `text` for a terminal: escape sequences removed and control characters but newline and tab
/// replaced, unbounded (`flower-hub run logs` prints a whole log).
pub fn printable(text: &str) -> String {
    strip_control(text, true)
}

fn cut(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut at = max;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let dropped = text.len() - at;
    text.truncate(at);
    text.push_str(&format!("… ({dropped} bytes cut)"));
    text
}

/// Removes CSI (`ESC [ … final`), OSC (`ESC ] … BEL` or `ESC \`) and other two-character
/// escapes; replaces the C0 and C1 controls and DEL (but `\n` and `\t` when `keep_lines`).
fn strip_control(text: &str, keep_lines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.next() {
                Some('[') => {
                    // Parameters and intermediates, up to a final byte in @..~.
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                Some(']' | 'P' | '_' | '^' | 'X') => {
                    // A string, up to BEL or ST (ESC \).
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' {
                            break;
                        }
                        if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                            chars.next();
                            break;
                        }
                    }
                }
                _ => {}
            },
            '\n' | '\t' if keep_lines => out.push(c),
            c if c.is_control() => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_go_and_controls_are_replaced() {
        // Invariant: no ESC, BEL, CR or other control character survives; newlines stay only
        // where asked; ordinary text is unchanged.
        let hostile = "red \u{1b}[31mtext\u{1b}[0m title\u{1b}]0;pwned\u{7} clear\u{1b}c back\rline\nnext\ttab\u{0}nul\u{9b}c1";
        let text = bounded(hostile, 1000);
        assert_eq!(
            text,
            "red text title clear back\u{fffd}line\nnext\ttab\u{fffd}nul\u{fffd}c1"
        );
        assert!(!bounded_line(hostile, 1000).contains(['\n', '\t']));
        assert_eq!(bounded("plain ünïcödé", 100), "plain ünïcödé");
        assert_eq!(printable("a\u{1b}[2Jb\n"), "ab\n");
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary_and_says_so() {
        // Invariant: the kept text is at most `max` bytes and ends on a whole character.
        let text = "é".repeat(3_000_000); // 6 MB
        let cut = bounded(&text, MAX_DETAILS);
        assert!(cut.len() < MAX_DETAILS + 40, "{}", cut.len());
        assert!(
            cut.ends_with("… (5995904 bytes cut)"),
            "{}",
            &cut[cut.len() - 40..]
        );
        assert_eq!(bounded("short", 5), "short");
    }

    #[test]
    fn an_unterminated_escape_swallows_only_itself() {
        // Invariant: a sequence cut off at the end of the text does not panic or loop.
        assert_eq!(bounded("ok\u{1b}[12", 100), "ok");
        assert_eq!(bounded("ok\u{1b}]title", 100), "ok");
        assert_eq!(bounded("ok\u{1b}", 100), "ok");
    }
}
