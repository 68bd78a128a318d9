//! Carbon-intensity forecasts from providers' files, for `nephele grid push --forecast`:
//! what a region's carbon decisions use, in place of the project's own forecast, for
//! the hours the provider covers (see `nephele_placement::grid`). Pure parsing:
//!
//! | format | what it looks like | issued at |
//! |---|---|---|
//! | Electricity Maps (`/v3/carbon-intensity/forecast`) | `{"zone", "forecast": [{"carbonIntensity", "datetime"}], "updatedAt"}` | `updatedAt` |
//! | Carbon Intensity API of Great Britain (`/intensity/{from}/fw48h`) | `{"data": [{"from", "to", "intensity": {"forecast", …}}]}`, half-hourly | not in the file |
//! | CSV as Electricity Maps exports it | `Datetime (UTC)` and a `Carbon Intensity …` column | not in the file |
//!
//! Half-hourly points are averaged into their hour. A file without an issue time is
//! taken as issued when it is pushed unless `--issued` says otherwise.

use anyhow::{bail, Context as _, Result};

/// A provider's forecast read from a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Forecast {
    /// Who made it (a name for operators).
    pub source: String,
    /// When it was made (unix seconds), if the file says.
    pub issued_unix: Option<u64>,
    /// (unix hour, gCO₂eq/kWh), one per hour, in time order.
    pub hours: Vec<(u64, f64)>,
}

/// Unix seconds of an ISO-8601 UTC time: `YYYY-MM-DD[T ]HH:MM[:SS[.fff]][Z|+00:00]`.
pub fn parse_utc_seconds(text: &str) -> Option<u64> {
    let text = text.trim();
    let number = |range: std::ops::Range<usize>| text.get(range)?.parse::<i64>().ok();
    let (year, month, day, hour, minute) = (
        number(0..4)?,
        number(5..7)?,
        number(8..10)?,
        number(11..13)?,
        number(14..16)?,
    );
    if text.get(4..5)? != "-" || text.get(7..8)? != "-" || text.get(13..14)? != ":" {
        return None;
    }
    if !matches!(text.get(10..11)?, " " | "T") {
        return None;
    }
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let mut rest = text.get(16..).unwrap_or("");
    let mut second = 0;
    if let Some(after) = rest.strip_prefix(':') {
        second = after.get(0..2)?.parse::<i64>().ok().filter(|s| *s < 61)?;
        rest = &after[2..];
        if let Some(fraction) = rest.strip_prefix('.') {
            let digits = fraction.chars().take_while(char::is_ascii_digit).count();
            if digits == 0 {
                return None;
            }
            rest = &fraction[digits..];
        }
    }
    if !matches!(rest, "" | "Z" | "+00:00") {
        return None;
    }
    let days = days_from_civil(year, month, day);
    u64::try_from(((days * 24 + hour) * 60 + minute) * 60 + second).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let doy = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Points (unix seconds, value) averaged into their hours, in time order.
fn into_hours(points: Vec<(u64, f64)>) -> Vec<(u64, f64)> {
    let mut hours: std::collections::BTreeMap<u64, (f64, u32)> = Default::default();
    for (unix, value) in points {
        let entry = hours.entry(unix / 3600).or_insert((0.0, 0));
        entry.0 += value;
        entry.1 += 1;
    }
    hours
        .into_iter()
        .map(|(hour, (sum, n))| (hour, sum / f64::from(n)))
        .collect()
}

/// Reads a forecast file in one of the formats above; `name` names it in errors.
pub fn parse(name: &str, text: &str) -> Result<Forecast> {
    let trimmed = text.trim_start();
    let forecast = if trimmed.starts_with('{') {
        let value: serde_json::Value =
            serde_json::from_str(text).with_context(|| format!("{name}: not JSON"))?;
        if let Some(points) = value["forecast"].as_array() {
            electricity_maps(name, &value, points)?
        } else if let Some(points) = value["data"].as_array() {
            carbon_intensity_gb(name, points)?
        } else {
            bail!("{name}: a JSON forecast needs a \"forecast\" list (Electricity Maps) or a \"data\" list (the Carbon Intensity API)");
        }
    } else {
        csv(name, text)?
    };
    if forecast.hours.is_empty() {
        bail!("{name}: the forecast has no points");
    }
    Ok(forecast)
}

fn electricity_maps(
    name: &str,
    value: &serde_json::Value,
    points: &[serde_json::Value],
) -> Result<Forecast> {
    let mut read = Vec::with_capacity(points.len());
    for (i, point) in points.iter().enumerate() {
        let at = point["datetime"]
            .as_str()
            .and_then(parse_utc_seconds)
            .with_context(|| format!("{name}: forecast[{i}].datetime is not a UTC time"))?;
        let carbon = point["carbonIntensity"]
            .as_f64()
            .with_context(|| format!("{name}: forecast[{i}].carbonIntensity is not a number"))?;
        read.push((at, carbon));
    }
    let issued_unix = match value.get("updatedAt") {
        None | Some(serde_json::Value::Null) => None,
        Some(at) => Some(
            at.as_str()
                .and_then(parse_utc_seconds)
                .with_context(|| format!("{name}: updatedAt is not a UTC time"))?,
        ),
    };
    let zone = value["zone"].as_str().unwrap_or("");
    Ok(Forecast {
        source: if zone.is_empty() {
            "electricitymaps".into()
        } else {
            format!("electricitymaps {zone}")
        },
        issued_unix,
        hours: into_hours(read),
    })
}

fn carbon_intensity_gb(name: &str, points: &[serde_json::Value]) -> Result<Forecast> {
    let mut read = Vec::with_capacity(points.len());
    for (i, point) in points.iter().enumerate() {
        let at = point["from"]
            .as_str()
            .and_then(parse_utc_seconds)
            .with_context(|| format!("{name}: data[{i}].from is not a UTC time"))?;
        let carbon = point["intensity"]["forecast"]
            .as_f64()
            .with_context(|| format!("{name}: data[{i}].intensity.forecast is not a number"))?;
        read.push((at, carbon));
    }
    Ok(Forecast {
        source: "carbonintensity.org.uk".into(),
        issued_unix: None,
        hours: into_hours(read),
    })
}

fn csv(name: &str, text: &str) -> Result<Forecast> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .collect();
    let time = header
        .iter()
        .position(|h| h.starts_with("Datetime") || h.eq_ignore_ascii_case("datetime"))
        .with_context(|| format!("{name}: no `Datetime (UTC)` column in the CSV header"))?;
    let carbon = header
        .iter()
        .position(|h| h.starts_with("Carbon Intensity") && !h.ends_with("(LCA)"))
        .with_context(|| {
            format!("{name}: no `Carbon Intensity gCO₂eq/kWh (direct)` column in the CSV header")
        })?;
    let mut read = Vec::new();
    for (number, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let line_no = number + 2;
        let at = fields
            .get(time)
            .and_then(|t| parse_utc_seconds(t))
            .with_context(|| format!("{name}:{line_no}: the time is not a UTC time"))?;
        let value = fields
            .get(carbon)
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("{name}:{line_no}: the carbon intensity is not a number"))?;
        read.push((at, value));
    }
    Ok(Forecast {
        source: name
            .rsplit('/')
            .next()
            .unwrap_or(name)
            .trim_end_matches(".csv")
            .to_string(),
        issued_unix: None,
        hours: into_hours(read),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_providers_write_them() {
        let hour = parse_utc_seconds("2023-08-31T10:00:00.000Z").unwrap();
        assert_eq!(hour % 3600, 0);
        assert_eq!(parse_utc_seconds("2023-08-31T10:00Z"), Some(hour));
        assert_eq!(parse_utc_seconds("2023-08-31 10:00:00"), Some(hour));
        assert_eq!(parse_utc_seconds("2023-08-31T10:00:00+00:00"), Some(hour));
        assert_eq!(
            parse_utc_seconds("2023-08-31T09:52:43.374Z"),
            Some(hour - 437)
        );
        assert_eq!(parse_utc_seconds("1970-01-01T00:00Z"), Some(0));
        for bad in [
            "2023-08-31T10:00+02:00",
            "2023-13-01T00:00Z",
            "yesterday",
            "2023-08-31T10:00:00.Z",
            "",
        ] {
            assert_eq!(parse_utc_seconds(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_three_formats_give_hours_in_order() {
        let em = r#"{"zone":"DE","forecast":[{"carbonIntensity":302,"datetime":"2023-08-31T11:00:00.000Z"},{"carbonIntensity":290,"datetime":"2023-08-31T10:00:00.000Z"}],"updatedAt":"2023-08-31T09:52:43.374Z"}"#;
        let f = parse("de.json", em).unwrap();
        assert_eq!(f.source, "electricitymaps DE");
        assert_eq!(f.issued_unix, parse_utc_seconds("2023-08-31T09:52:43Z"));
        let ten = parse_utc_seconds("2023-08-31T10:00Z").unwrap() / 3600;
        assert_eq!(f.hours, vec![(ten, 290.0), (ten + 1, 302.0)]);
        let gb = r#"{"data":[{"from":"2023-08-31T10:00Z","to":"2023-08-31T10:30Z","intensity":{"forecast":100,"actual":null,"index":"low"}},{"from":"2023-08-31T10:30Z","to":"2023-08-31T11:00Z","intensity":{"forecast":120,"index":"low"}}]}"#;
        let f = parse("gb.json", gb).unwrap();
        assert_eq!(f.source, "carbonintensity.org.uk");
        assert_eq!(f.issued_unix, None);
        assert_eq!(f.hours, vec![(ten, 110.0)]);
        let csv = "Datetime (UTC),Zone Id,Carbon Intensity gCO₂eq/kWh (direct),Carbon Intensity gCO₂eq/kWh (LCA)\n2023-08-31 10:00:00,DE,250.5,300\n2023-08-31 11:00:00,DE,240,290\n";
        let f = parse("forecasts/DE-forecast.csv", csv).unwrap();
        assert_eq!(f.source, "DE-forecast");
        assert_eq!(f.hours, vec![(ten, 250.5), (ten + 1, 240.0)]);
    }

    #[test]
    fn bad_files_say_what_is_wrong_where() {
        for (text, says) in [
            (
                "{\"forecast\": [{\"datetime\": \"soon\", \"carbonIntensity\": 3}]}",
                "forecast[0].datetime",
            ),
            (
                "{\"forecast\": [{\"datetime\": \"2023-08-31T10:00Z\"}]}",
                "forecast[0].carbonIntensity",
            ),
            ("{\"forecast\": [], \"updatedAt\": \"now\"}", "updatedAt"),
            ("{\"forecast\": []}", "no points"),
            ("{\"other\": 1}", "needs a \"forecast\" list"),
            ("{not json", "not JSON"),
            ("a,b\n1,2\n", "Datetime"),
            (
                "Datetime (UTC),Carbon Intensity gCO₂eq/kWh (direct)\n2023-08-31 10:00:00,x\n",
                "f.csv:2",
            ),
        ] {
            let error = format!("{:#}", parse("f.csv", text).unwrap_err());
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
