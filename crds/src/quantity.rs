//! Kubernetes resource quantities (`500m`, `4`, `16Gi`, `1e9`) as numbers, for the capacity an
//! agent reports and the Placement prioritizers that rank clusters by it.

/// The value of a quantity in base units (cores, bytes), or `None` if it is not one.
pub fn parse_quantity(text: &str) -> Option<f64> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => 10f64.powi(exp[1..].parse::<i32>().ok()?),
        _ => return None,
    };
    let value = number * factor;
    value.is_finite().then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_and_exponents() {
        // Every spelling kubelets and users write for CPU and memory.
        assert_eq!(parse_quantity("4"), Some(4.0));
        assert!((parse_quantity("3800m").unwrap() - 3.8).abs() < 1e-9);
        assert_eq!(parse_quantity("16Gi"), Some(17_179_869_184.0));
        assert_eq!(parse_quantity("16384Ki"), Some(16_777_216.0));
        assert_eq!(parse_quantity("1e9"), Some(1e9));
        assert_eq!(parse_quantity("2k"), Some(2000.0));
        assert_eq!(parse_quantity(""), None);
        assert_eq!(parse_quantity("lots"), None);
        assert_eq!(parse_quantity("4Qi"), None);
    }
}
