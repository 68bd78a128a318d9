//! How answers are printed: JSON/YAML exactly as the API wrote them, or a table
//! with numbers and times said for people.

use anyhow::{Context as _, Result};
use serde_json::Value;

pub(crate) fn print(json: bool, value: &Value, table: impl FnOnce(&Value)) {
    if json && crate::output::yaml() {
        print!("{}", crate::output::to_yaml(value));
    } else if json {
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
    } else {
        table(value);
    }
}

pub(crate) fn typed<T: serde::de::DeserializeOwned>(what: &str, value: Value) -> Result<T> {
    serde_json::from_value(value).with_context(|| {
        format!("{what}: the answer is not what this version of nephele expects; use a CLI of the control plane's version")
    })
}

/// Prints a typed answer: JSON or YAML when asked (exactly the API's document), else
/// the table.
pub(crate) fn show<T: serde::Serialize>(json: bool, view: &T, table: impl FnOnce(&T)) {
    if json {
        let value = serde_json::to_value(view).unwrap_or(Value::Null);
        print(json, &value, |_| {});
    } else {
        table(view);
    }
}

/// `-` for nothing, the text otherwise.
pub(crate) fn text(value: Option<&str>) -> String {
    value.map_or_else(|| "-".to_string(), str::to_string)
}

/// A number (or anything) as the API's JSON writes it (`1.0`, not `1`), `-` for none.
pub(crate) fn num<T: serde::Serialize>(value: Option<T>) -> String {
    match value.map(|v| serde_json::to_value(v).unwrap_or(Value::Null)) {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(text)) => text,
        Some(other) => other.to_string(),
    }
}

pub(crate) fn s(value: &Value, key: &str) -> String {
    match value.get(key) {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
}

/// A unix second as a UTC date and time, with how long ago or from now.
/// A time as a date with its age (`2026-12-03 13:07:15 UTC (in 83 min)`), `-` for none.
pub(crate) fn when_unix(unix: Option<u64>) -> String {
    let Some(unix) = unix else {
        return "-".into();
    };
    let now = unix_now();
    let days = unix / 86_400;
    let (h, m, sec) = (unix % 86_400 / 3600, unix % 3600 / 60, unix % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let relative = if unix > now {
        format!("in {}", span(unix - now))
    } else {
        format!("{} ago", span(now - unix))
    };
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{sec:02} UTC ({relative})")
}

fn span(seconds: u64) -> String {
    match seconds {
        0..=119 => format!("{seconds} s"),
        120..=7199 => format!("{} min", seconds / 60),
        7200..=172_799 => format!("{} h", seconds / 3600),
        _ => format!("{} d", seconds / 86_400),
    }
}

/// Now, in unix seconds.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `YYYY-MM-DD HH:00 UTC` of a unix second.
pub(crate) fn utc(unix: u64) -> String {
    format!(
        "{} UTC",
        nephele_sim::trace::format_utc_hour((unix / 3600) as i64)
    )
}
