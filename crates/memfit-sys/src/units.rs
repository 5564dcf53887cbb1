//! Sizes, percentages and durations as users type them, and bytes as people read them.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UnitError {
    #[error("size {0:?}: expected a number with a unit such as 512MiB, 8GiB, 2G or 1500MB")]
    Size(String),
    #[error("size {0:?} has no unit: write {0}GiB, {0}MiB or {0}B (bytes)")]
    NoUnit(String),
    #[error(
        "{0:?} has no unit: write a size such as {0}GiB, {0}MiB or {0}B (bytes), or a share such as {0}%"
    )]
    NoUnitOrPercent(String),
    #[error("percentage {0:?}: expected a number between 0 and 100 followed by %, such as 90%")]
    Percent(String),
    #[error("duration {0:?}: expected a number with a unit such as 500ms, 30s, 2m or 1h")]
    Duration(String),
}

const KIB: u64 = 1024;

/// Parses `512MiB`, `8GiB`, `8G` (binary, as `free -g` and Docker read it), `1500MB` (decimal) or
/// `4096B`. A bare number is refused: `--budget 10` meant 10 GiB far more often than 10 bytes.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| UnitError::Size(text.into()))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" => return Err(UnitError::NoUnit(t.into())),
        "b" => 1,
        "k" | "ki" | "kib" => KIB,
        "m" | "mi" | "mib" => KIB.pow(2),
        "g" | "gi" | "gib" => KIB.pow(3),
        "t" | "ti" | "tib" => KIB.pow(4),
        "kb" => 1000,
        "mb" => 1000u64.pow(2),
        "gb" => 1000u64.pow(3),
        "tb" => 1000u64.pow(4),
        _ => return Err(UnitError::Size(text.into())),
    };
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(UnitError::Size(text.into()));
    }
    Ok(bytes.round() as u64)
}

/// Parses `90%` or `90` into the fraction 0.9; 0 and values above 100 are refused.
pub fn parse_percent(text: &str) -> Result<f64, UnitError> {
    let t = text.trim();
    let number = t.strip_suffix('%').unwrap_or(t).trim();
    match number.parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 100.0 => Ok(p / 100.0),
        _ => Err(UnitError::Percent(text.into())),
    }
}

/// A memory amount given either in bytes or as a share of some total known later.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SizeOrPercent {
    Bytes(u64),
    Fraction(f64),
}

impl SizeOrPercent {
    /// `80%` → a fraction, anything else → a size (a bare number is neither, and says so).
    pub fn parse(text: &str) -> Result<Self, UnitError> {
        if text.trim_end().ends_with('%') {
            parse_percent(text).map(Self::Fraction)
        } else {
            parse_size(text).map(Self::Bytes).map_err(|e| match e {
                UnitError::NoUnit(t) => UnitError::NoUnitOrPercent(t),
                other => other,
            })
        }
    }

    pub fn resolve(self, total: u64) -> u64 {
        match self {
            Self::Bytes(b) => b,
            Self::Fraction(f) => (total as f64 * f) as u64,
        }
    }
}

/// Parses `500ms`, `30s`, `2m`, `1h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| UnitError::Duration(text.into()))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(UnitError::Duration(text.into())),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| UnitError::Duration(text.into()))
}

/// Bytes as GiB with two decimals (docs/architecture.md §2), or MiB below one GiB (KiB, bytes below those) so
/// small numbers stay readable.
pub fn human_bytes(bytes: u64) -> String {
    let gib = bytes as f64 / KIB.pow(3) as f64;
    if gib >= 1.0 {
        format!("{gib:.2} GiB")
    } else if bytes >= KIB.pow(2) {
        format!("{:.1} MiB", bytes as f64 / KIB.pow(2) as f64)
    } else if bytes >= KIB {
        format!("{:.1} KiB", bytes as f64 / KIB as f64)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1500MB"), Ok(1_500_000_000));
        assert_eq!(parse_size("4096B"), Ok(4096));
        // a bare number asks for a unit
        assert_eq!(parse_size("10"), Err(UnitError::NoUnit("10".into())));
        assert!(UnitError::NoUnit("10".into()).to_string().contains("10GiB"));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn percents_and_either() {
        assert_eq!(parse_percent("90%"), Ok(0.9));
        assert!(parse_percent("0%").is_err());
        assert!(parse_percent("101%").is_err());
        assert_eq!(
            SizeOrPercent::parse("50%"),
            Ok(SizeOrPercent::Fraction(0.5))
        );
        assert_eq!(
            SizeOrPercent::parse("1GiB"),
            Ok(SizeOrPercent::Bytes(1 << 30))
        );
        assert_eq!(SizeOrPercent::Fraction(0.5).resolve(1000), 500);
        let bare = SizeOrPercent::parse("10").unwrap_err();
        assert_eq!(bare, UnitError::NoUnitOrPercent("10".into()));
        assert!(bare.to_string().contains("10%"), "{bare}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn human() {
        assert_eq!(human_bytes(3 << 30), "3.00 GiB");
        assert_eq!(human_bytes(300 << 20), "300.0 MiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(10), "10 B");
    }
}
