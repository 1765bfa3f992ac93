//! Git-style path patterns exactly as Flower matches them: `pathspec.PathSpec.from_lines(
//! "gitwildmatch", …)` of pathspec 1.1 (`GitIgnoreSpecPattern`), ported rule for rule so that a
//! FAB holds the same files `flwr build` puts in it. Each pattern becomes a regular expression;
//! the last pattern that matches a path decides (a `!pattern` re-includes).

use regex::Regex;

/// A pattern pathspec refuses (Flower reports these as build errors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatternError {
    /// The pattern as written.
    pub pattern: String,
    /// Why it is refused.
    pub reason: String,
}

/// Compiled patterns, in order.
#[derive(Clone, Debug)]
pub struct PathSpec {
    /// `(regex, include)`; no-op patterns (blank, comments, invalid ranges) are dropped.
    patterns: Vec<(Regex, bool)>,
}

// === impl PathSpec ===

impl PathSpec {
    /// Compiles `lines` as pathspec's `from_lines("gitwildmatch", lines)` does (empty lines are
    /// skipped).
    pub fn from_lines<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<Self, PatternError> {
        let mut patterns = Vec::new();
        for line in lines.into_iter().filter(|l| !l.is_empty()) {
            let error = |reason: String| PatternError {
                pattern: line.to_owned(),
                reason,
            };
            if let Some((regex, include)) = pattern_to_regex(line).map_err(error)? {
                let compiled = Regex::new(&regex).map_err(|e| error(e.to_string()))?;
                patterns.push((compiled, include));
            }
        }
        Ok(Self { patterns })
    }

    /// Whether the last pattern matching `path` includes it (`Some(true)`), excludes it
    /// (`Some(false)`, a `!pattern`), or no pattern matches (`None`).
    pub fn check(&self, path: &str) -> Option<bool> {
        let path = normalize(path);
        self.patterns
            .iter()
            .rev()
            .find(|(regex, _)| regex.is_match(path))
            .map(|(_, include)| *include)
    }

    /// pathspec's `match_file`: the path is matched and included.
    pub fn matches(&self, path: &str) -> bool {
        self.check(path) == Some(true)
    }
}

/// pathspec's `normalize_file` on POSIX: a leading `/` or `./` is dropped.
fn normalize(path: &str) -> &str {
    path.strip_prefix('/')
        .or_else(|| path.strip_prefix("./"))
        .unwrap_or(path)
}

/// Python's `str.isspace()`: Unicode White_Space plus the ASCII separators U+001C..U+001F.
pub fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Matches at the end of a path like Python's `$` (which also matches before a final newline).
const END: &str = r"\n?\z";

/// `GitIgnoreSpecPattern.pattern_to_regex`: `Ok(None)` for a no-op pattern, else the regular
/// expression (for the `regex` crate) and whether a match includes the path.
fn pattern_to_regex(pattern: &str) -> Result<Option<(String, bool)>, String> {
    // Trailing whitespace is not part of a pattern unless escaped ("\ ").
    let pattern = if pattern.ends_with("\\ ") {
        pattern
    } else {
        pattern.trim_end_matches(py_isspace)
    };
    if pattern.is_empty() || pattern.starts_with('#') || pattern == "/" {
        return Ok(None);
    }
    let (include, pattern) = match pattern.strip_prefix('!') {
        Some(rest) => (false, rest),
        None => (true, pattern),
    };
    let mut segs: Vec<&str> = pattern.split('/').collect();
    let is_dir_pattern = segs.last().is_some_and(|s| s.is_empty());

    if segs[0].is_empty() {
        // "/x": relative to the root.
        segs.remove(0);
    } else if (segs.len() == 1 || (segs.len() == 2 && segs[1].is_empty())) && segs[0] != "**" {
        // "x" or "x/": at any depth.
        segs.insert(0, "**");
    }
    if segs.is_empty() {
        return Err("Pattern normalized to nothing.".to_owned());
    }
    if let Some(last) = segs.last_mut()
        && last.is_empty()
    {
        *last = "**";
    }
    // "**/**" is "**".
    for i in (1..segs.len()).rev() {
        if segs[i - 1] == "**" && segs[i] == "**" {
            segs.remove(i);
        }
    }
    let regex = match segs.as_slice() {
        ["**"] if is_dir_pattern => "/".to_owned(),
        ["**"] | ["**", "*"] => ".".to_owned(),
        ["**", "*", "**"] => "/".to_owned(),
        _ => match translate_segments(&segs)? {
            Some(regex) => regex,
            None => return Ok(None),
        },
    };
    Ok(Some((regex, include)))
}

/// `__translate_segments`; `Ok(None)` when a segment has an unterminated `[` (Git discards such
/// patterns).
fn translate_segments(segs: &[&str]) -> Result<Option<String>, String> {
    let mut out = String::new();
    let mut need_slash = false;
    let end = segs.len() - 1;
    for (i, seg) in segs.iter().enumerate() {
        if *seg == "**" {
            if i == 0 {
                out.push_str("^(?:.+/)?");
            } else if i < end {
                out.push_str("(?:/.+)?");
                need_slash = true;
            } else {
                out.push('/');
            }
            continue;
        }
        if i == 0 {
            out.push('^');
        }
        if need_slash {
            out.push('/');
        }
        if *seg == "*" {
            out.push_str("[^/]+");
        } else {
            match translate_glob(seg)? {
                Some(regex) => out.push_str(&regex),
                None => return Ok(None),
            }
        }
        if i == end {
            out.push_str(&format!("(?:/|{END})"));
        }
        need_slash = true;
    }
    Ok(Some(out))
}

/// `_translate_segment_glob(pattern, "raise")`: `*`, `?`, `[...]` and `\` escapes of one path
/// segment; `Ok(None)` for an unterminated bracket expression.
fn translate_glob(glob: &str) -> Result<Option<String>, String> {
    let chars: Vec<char> = glob.chars().collect();
    let end = chars.len();
    let mut out = String::new();
    let mut escape = false;
    let mut i = 0;
    while i < end {
        let c = chars[i];
        i += 1;
        if escape {
            escape = false;
            out.push_str(&regex::escape(c.encode_utf8(&mut [0; 4])));
        } else if c == '\\' {
            escape = true;
        } else if c == '*' {
            out.push_str("[^/]*");
        } else if c == '?' {
            out.push_str("[^/]");
        } else if c == '[' {
            let mut j = i;
            if j < end && (chars[j] == '!' || chars[j] == '^') {
                j += 1;
            }
            if j < end && chars[j] == ']' {
                j += 1;
            }
            while j < end && chars[j] != ']' {
                j += 1;
            }
            if j >= end {
                return Ok(None);
            }
            let negate = chars[i] == '!' || chars[i] == '^';
            let start = if negate { i + 1 } else { i };
            out.push_str(&bracket_class(negate, &chars[start..j])?);
            i = j + 1;
        } else {
            out.push_str(&regex::escape(c.encode_utf8(&mut [0; 4])));
        }
    }
    if escape {
        return Err(format!(
            "Escape character found with no next character to escape: {glob:?}"
        ));
    }
    Ok(Some(out))
}

/// A bracket expression's members as Python's regex engine reads `[` + members + `]` (every
/// member literal, `a-z` ranges, a `-` first or last literal), written as an explicit class for
/// the `regex` crate, whose own class syntax (`[[:alpha:]]`, `&&`, `--`) differs.
fn bracket_class(negate: bool, members: &[char]) -> Result<String, String> {
    let mut ranges: Vec<(char, char)> = Vec::new();
    let mut k = 0;
    while k < members.len() {
        let lo = members[k];
        k += 1;
        if k < members.len() && members[k] == '-' {
            if k + 1 < members.len() {
                let hi = members[k + 1];
                if hi < lo {
                    return Err(format!("bad character range {lo}-{hi}"));
                }
                ranges.push((lo, hi));
                k += 2;
            } else {
                ranges.push((lo, lo));
                ranges.push(('-', '-'));
                k += 1;
            }
        } else {
            ranges.push((lo, lo));
        }
    }
    let mut class = String::from(if negate { "[^" } else { "[" });
    for (lo, hi) in ranges {
        class.push_str(&format!("\\x{{{:X}}}", u32::from(lo)));
        if hi != lo {
            class.push_str(&format!("-\\x{{{:X}}}", u32::from(hi)));
        }
    }
    class.push(']');
    Ok(class)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(lines: &[&str]) -> PathSpec {
        PathSpec::from_lines(lines.iter().copied()).expect("valid patterns")
    }

    #[test]
    fn single_segment_patterns_match_at_any_depth() {
        let s = spec(&["*.py"]);
        assert!(s.matches("a.py"));
        assert!(s.matches("pkg/sub/a.py"));
        assert!(!s.matches("a.pyc"));
    }

    #[test]
    fn leading_slash_and_inner_slash_anchor_at_the_root() {
        let s = spec(&["/LICENSE", "build/**"]);
        assert!(s.matches("LICENSE"));
        assert!(!s.matches("docs/LICENSE"));
        assert!(s.matches("build/x.py"));
        assert!(!s.matches("pkg/build/x.py"));
    }

    #[test]
    fn directory_patterns_match_what_is_below() {
        let s = spec(&["out/"]);
        assert!(s.matches("out/a.py"));
        assert!(s.matches("pkg/out/a.py"));
        assert!(!s.matches("out"));
    }

    #[test]
    fn the_last_matching_pattern_decides() {
        let s = spec(&["*.json", "!keep.json"]);
        assert_eq!(s.check("a.json"), Some(true));
        assert_eq!(s.check("keep.json"), Some(false));
        assert_eq!(s.check("a.py"), None);
    }

    #[test]
    fn brackets_are_literal_classes_and_unterminated_ones_are_dropped() {
        let s = spec(&["[[:]x", "[a-c].md", "[z"]);
        assert!(s.matches(":x"));
        assert!(s.matches("[x"));
        assert!(s.matches("b.md"));
        assert!(!s.matches("d.md"));
        assert!(!s.matches("[z"));
    }

    #[test]
    fn broken_patterns_are_errors() {
        assert!(PathSpec::from_lines(["!"]).is_err());
        assert!(PathSpec::from_lines(["a\\"]).is_err());
        assert!(PathSpec::from_lines(["[z-a]"]).is_err());
    }
}
