//! A run's log tail and the round progress read from it.
use super::*;

/// Adds log text the SuperLink streamed: the last [`LOG_TAIL_LINES`] lines are kept, the
/// timestamp to resume after is stored and the round progress read from the new lines.
pub fn add_log(s: &mut FlowerRunStatus, text: &str, timestamp: f64) {
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if let Some((current, total)) = round_of(line) {
            let previous = s.progress.as_ref().map_or(0, |p| p.current);
            let total = total.or(s.progress.as_ref().and_then(|p| p.total));
            if current >= previous {
                s.progress = Some(RunProgress {
                    current,
                    total,
                    text: match total {
                        Some(t) => format!("{current}/{t}"),
                        None => current.to_string(),
                    },
                });
            }
        }
        s.log_tail.push(crate::core::text::bounded_line(
            line,
            crate::core::text::MAX_LOG_LINE,
        ));
    }
    let excess = s.log_tail.len().saturating_sub(LOG_TAIL_LINES);
    s.log_tail.drain(..excess);
    if timestamp.is_finite() && s.log_timestamp.is_none_or(|t| timestamp > t) {
        s.log_timestamp = Some(timestamp);
    }
}

/// The round a log line reports: Flower's strategies log `[ROUND 2/3]` (1.42's message API) or
/// `[ROUND 2]` (the legacy server); apps like examples/fedavg print `round 2/3: …`.
pub fn round_of(line: &str) -> Option<(i32, Option<i32>)> {
    let lower = line.to_ascii_lowercase();
    let start = if let Some(i) = lower.find("[round ") {
        i + "[round ".len()
    } else {
        let i = lower.find("round ")?;
        // Only at the start of the message: after a log prefix (`INFO :      `) or nothing.
        let before = lower[..i].trim_end();
        if !(before.is_empty() || before.ends_with(':')) {
            return None;
        }
        i + "round ".len()
    };
    let rest = &lower[start..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let current: i32 = digits.parse().ok()?;
    let after = &rest[digits.len()..];
    let total = after.strip_prefix('/').and_then(|t| {
        let d: String = t.chars().take_while(char::is_ascii_digit).collect();
        d.parse().ok()
    });
    Some((current, total))
}
