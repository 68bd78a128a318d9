//! Loading the public traces from `../shared/data` (the path is the caller's choice):
//! the openb GPU cluster, and the hourly carbon-intensity and electricity-price series.
//! Every error names the file and line, and says which folder `--data` should point at.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context as _, Result};
use nephele_placement::{NodeSpec, PodRequest};
use serde::Serialize;

/// One CSV row by column name.
pub type Row = BTreeMap<String, String>;

/// Reads a simple CSV (no quoted commas) into rows by header name.
pub fn read_csv(path: &Path) -> Result<Vec<Row>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {} (pass --data with the folder that holds the traces, e.g. ../shared/data)",
            path.display()
        )
    })?;
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .with_context(|| format!("{}: empty CSV", path.display()))?
        .split(',')
        .map(|h| h.trim().to_string())
        .collect();
    let mut rows = Vec::new();
    for (number, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != header.len() {
            bail!(
                "{}:{}: {} fields, header has {}",
                path.display(),
                number + 2,
                fields.len(),
                header.len()
            );
        }
        rows.push(
            header
                .iter()
                .cloned()
                .zip(fields.iter().map(|f| f.to_string()))
                .collect(),
        );
    }
    Ok(rows)
}

/// A parsed column, with an error naming the column and the value.
pub fn field<T: std::str::FromStr>(row: &Row, key: &str) -> Result<T> {
    let value = row
        .get(key)
        .with_context(|| format!("missing column {key}"))?;
    value
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("column {key}: cannot parse {value:?}"))
}

/// What the openb pod list says about a pod besides its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMeta {
    pub name: String,
    /// LS, BE, Burstable, Guaranteed…
    pub qos: String,
    /// Running, Succeeded, Failed, Pending (at the snapshot).
    pub phase: String,
    /// Seconds from the trace's start.
    pub creation: u64,
    pub deletion: u64,
    pub scheduled: u64,
}

/// The openb GPU cluster: GPU nodes sorted by serial number, pods by name.
#[derive(Debug, Clone)]
pub struct Trace {
    pub nodes: Vec<NodeSpec>,
    pub pods: Vec<PodRequest>,
    /// In the same order as `pods`.
    pub meta: Vec<PodMeta>,
    /// Interned GPU model names (index = `GpuModel`).
    pub models: Vec<String>,
}

/// The columns a pod list may have: the first five are required.
const POD_COLUMNS: [&str; 11] = [
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
];

/// Loads `alibaba-gpu-v2023/openb_node_list_gpu_node.csv` and `openb_pod_list_default.csv`.
pub fn load_openb(data: &Path) -> Result<Trace> {
    load_openb_with(
        data,
        &data.join("alibaba-gpu-v2023/openb_pod_list_default.csv"),
    )
}

/// The pod list `pods` names: a path as given when it is one (has a `/` or ends in
/// `.csv`), else `alibaba-gpu-v2023/openb_pod_list_<pods>.csv` in `data`.
pub fn pod_list_path(data: &Path, pods: &str) -> std::path::PathBuf {
    if pods.contains('/') || pods.ends_with(".csv") {
        std::path::PathBuf::from(pods)
    } else {
        data.join(format!("alibaba-gpu-v2023/openb_pod_list_{pods}.csv"))
    }
}

/// A pod list's name: its file name without `openb_pod_list_` and `.csv`.
pub fn pod_list_name(path: &Path) -> String {
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().to_string())
        .unwrap_or_default();
    let file = file.strip_suffix(".csv").unwrap_or(&file);
    file.strip_prefix("openb_pod_list_")
        .unwrap_or(file)
        .to_string()
}

/// Every `openb_pod_list_*.csv` in `data`'s `alibaba-gpu-v2023/`, by name.
pub fn all_pod_lists(data: &Path) -> Result<Vec<std::path::PathBuf>> {
    let dir = data.join("alibaba-gpu-v2023");
    let mut lists: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .map(|f| f.to_string_lossy().to_string())
                .is_some_and(|f| f.starts_with("openb_pod_list_") && f.ends_with(".csv"))
        })
        .collect();
    lists.sort();
    if lists.is_empty() {
        anyhow::bail!("no openb_pod_list_*.csv in {}", dir.display());
    }
    Ok(lists)
}

/// The openb GPU node list of `data` with the pod list at `pod_path`: the trace
/// repository's 11-column lists, or the 5-column ones (`name, cpu_milli, memory_mib,
/// num_gpu, gpu_milli`) other openb lists use; columns a pod does not need (GPU type,
/// QoS, times) default to none and 0.
// `..Default::default()` stays so that fields added to the placement model later keep
// their defaults here without an edit (clippy flags it while every field is set).
pub fn load_openb_with(data: &Path, pod_path: &Path) -> Result<Trace> {
    let dir = data.join("alibaba-gpu-v2023");
    let mut models: Vec<String> = Vec::new();
    let mut intern = |name: &str| -> u16 {
        if let Some(idx) = models.iter().position(|m| m == name) {
            return idx as u16;
        }
        models.push(name.to_string());
        (models.len() - 1) as u16
    };
    let node_path = dir.join("openb_node_list_gpu_node.csv");
    let mut node_rows = read_csv(&node_path)?;
    node_rows.sort_by(|a, b| a.get("sn").cmp(&b.get("sn")));
    let mut nodes = Vec::new();
    for row in &node_rows {
        let gpus: u8 = field(row, "gpu").with_context(|| node_path.display().to_string())?;
        let model = row.get("model").map(String::as_str).unwrap_or("");
        nodes.push(NodeSpec {
            name: row.get("sn").cloned().unwrap_or_default(),
            cpu_milli: field(row, "cpu_milli")?,
            memory_mib: field(row, "memory_mib")?,
            gpus,
            gpu_model: (gpus > 0 && !model.is_empty()).then(|| intern(model)),
            ..NodeSpec::default()
        });
    }
    let mut pod_rows = read_csv(pod_path)?;
    // A misspelt column (`gpuspec`, `gpu_mili`) would otherwise be dropped without a
    // word, and with it the GPU-type constraints or shares the list meant.
    if let Some(unknown) = pod_rows
        .first()
        .and_then(|row| row.keys().find(|key| !POD_COLUMNS.contains(&key.as_str())))
    {
        bail!(
            "{}: unknown column {unknown:?}; a pod list has name,cpu_milli,memory_mib,num_gpu,gpu_milli and optionally {} (rename or remove the column)",
            pod_path.display(),
            POD_COLUMNS[5..].join(",")
        );
    }
    pod_rows.sort_by(|a, b| a.get("name").cmp(&b.get("name")));
    let mut pods = Vec::new();
    let mut meta = Vec::new();
    for row in &pod_rows {
        let context = || format!("{} pod {:?}", pod_path.display(), row.get("name"));
        let num_gpu: u8 = field(row, "num_gpu").with_context(context)?;
        let gpu_milli: u32 = field::<u32>(row, "gpu_milli")
            .with_context(context)?
            .min(1000);
        let spec = row.get("gpu_spec").map(String::as_str).unwrap_or("");
        pods.push(PodRequest {
            cpu_milli: field(row, "cpu_milli").with_context(context)?,
            memory_mib: field(row, "memory_mib").with_context(context)?,
            num_gpu,
            gpu_milli: if num_gpu == 0 { 0 } else { gpu_milli },
            gpu_models: spec
                .split('|')
                .filter(|s| !s.is_empty())
                .map(&mut intern)
                .collect(),
            ..PodRequest::default()
        });
        // Times are optional (a 5-column list has none), but wrong when present.
        let time = |key: &str| -> Result<Option<u64>> {
            match row.get(key) {
                None => Ok(None),
                Some(_) => field(row, key).map(Some).with_context(context),
            }
        };
        let creation = time("creation_time")?.unwrap_or(0);
        meta.push(PodMeta {
            name: row.get("name").cloned().unwrap_or_default(),
            qos: row.get("qos").cloned().unwrap_or_default(),
            phase: row.get("pod_phase").cloned().unwrap_or_default(),
            creation,
            deletion: time("deletion_time")?.unwrap_or(creation),
            scheduled: field(row, "scheduled_time").unwrap_or(creation),
        });
    }
    Ok(Trace {
        nodes,
        pods,
        meta,
        models,
    })
}

/// An hourly series on a gap-free grid, with what had to be repaired to get there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HourlySeries {
    pub zone: String,
    /// Hours since 1970-01-01 00:00 UTC of `values[0]`.
    #[serde(skip)]
    pub start_hour: i64,
    /// One value per hour from the first row's hour on.
    #[serde(skip)]
    pub values: Vec<f64>,
    /// Hours missing in the file, filled by linear interpolation between neighbours.
    pub filled: usize,
    /// Rows whose hour was already seen (the first one is kept).
    pub duplicates: usize,
    /// Rows the source marks as estimated (carbon only; kept as they are).
    pub estimated: usize,
}

impl HourlySeries {
    /// `len` hourly values from `start` (a `YYYY-MM-DD HH` UTC time): hours before the
    /// series take its first value, hours after it its last.
    pub fn on_grid(&self, start: &str, len: usize) -> Result<Vec<f64>> {
        let start = parse_utc_hour(start).with_context(|| format!("bad grid start {start:?}"))?;
        let (Some(first), Some(last)) = (self.values.first(), self.values.last()) else {
            bail!("{}: empty series", self.zone);
        };
        Ok((0..len as i64)
            .map(|i| {
                let at = start + i - self.start_hour;
                usize::try_from(at)
                    .ok()
                    .map_or(*first, |at| self.values.get(at).copied().unwrap_or(*last))
            })
            .collect())
    }
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

/// `YYYY-MM-DD HH:00` (UTC) of an hour since 1970 (0 for earlier hours).
pub fn format_utc_hour(hour: i64) -> String {
    nephele_placement::grid::utc_hour(u64::try_from(hour).unwrap_or(0))
        .trim_end_matches(" UTC")
        .to_string()
}

/// Hours since 1970 of `YYYY-MM-DD HH:MM:SS[+00:00]` or `YYYY-MM-DDTHH:MM[Z]` (UTC);
/// minutes are dropped, so IN-WE's half-hour prices count for the hour that holds them.
pub fn parse_utc_hour(text: &str) -> Option<i64> {
    let text = text.trim();
    let number = |range: std::ops::Range<usize>| text.get(range)?.parse::<i64>().ok();
    let (year, month, day, hour) = (
        number(0..4)?,
        number(5..7)?,
        number(8..10)?,
        number(11..13)?,
    );
    if text.get(4..5)? != "-" || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    if !matches!(text.get(10..11)?, " " | "T") {
        return None;
    }
    if !(0..24).contains(&hour) {
        return None;
    }
    let rest = text.get(13..).unwrap_or("");
    let offset = rest.trim_start_matches(|c: char| c == ':' || c.is_ascii_digit());
    if !offset.is_empty() && offset != "+00:00" && offset != "Z" {
        return None;
    }
    Some(days_from_civil(year, month, day) * 24 + hour)
}

/// Reads `path`, takes the UTC time from column 0 and the value from the column whose
/// header satisfies `pick`, and puts the values on an hourly grid. Gaps are filled by
/// linear interpolation and counted; duplicates are dropped and counted; a time going
/// backwards or an unparsable value is an error naming the file and line.
fn load_hourly(
    path: &Path,
    zone: &str,
    pick: impl Fn(&str) -> bool,
    estimated_column: Option<&str>,
) -> Result<HourlySeries> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {} (pass --data with the folder that holds carbon-intensity-hourly-2023/ and electricity-prices-hourly-2023/, e.g. ../shared/data)",
            path.display()
        )
    })?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .with_context(|| format!("{}: empty file", path.display()))?
        .split(',')
        .map(str::trim)
        .collect();
    let column = header
        .iter()
        .position(|h| pick(h))
        .with_context(|| format!("{}:1: no value column in header {header:?}", path.display()))?;
    let estimated_at = estimated_column.and_then(|name| header.iter().position(|h| *h == name));
    let mut series = HourlySeries {
        zone: zone.to_string(),
        start_hour: 0,
        values: Vec::new(),
        filled: 0,
        duplicates: 0,
        estimated: 0,
    };
    let mut first_hour: Option<i64> = None;
    for (number, line) in lines.enumerate() {
        let line_no = number + 2;
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != header.len() {
            bail!(
                "{}:{line_no}: {} fields, header has {}",
                path.display(),
                fields.len(),
                header.len()
            );
        }
        let hour = parse_utc_hour(fields[0]).with_context(|| {
            format!(
                "{}:{line_no}: cannot parse time {:?}",
                path.display(),
                fields[0]
            )
        })?;
        let value: f64 = fields[column]
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite())
            .with_context(|| {
                format!(
                    "{}:{line_no}: cannot parse {:?} in column {:?}",
                    path.display(),
                    fields[column],
                    header[column]
                )
            })?;
        if estimated_at.is_some_and(|at| fields[at].trim() == "true") {
            series.estimated += 1;
        }
        let start = *first_hour.get_or_insert(hour);
        let Ok(index) = usize::try_from(hour - start) else {
            bail!("{}:{line_no}: time goes backwards", path.display());
        };
        match index.cmp(&series.values.len()) {
            std::cmp::Ordering::Less => {
                if index + 1 == series.values.len() {
                    series.duplicates += 1;
                } else {
                    bail!("{}:{line_no}: time goes backwards", path.display());
                }
            }
            std::cmp::Ordering::Equal => series.values.push(value),
            std::cmp::Ordering::Greater => {
                let Some(&last) = series.values.last() else {
                    bail!("{}:{line_no}: time goes backwards", path.display());
                };
                let gap = index - series.values.len();
                if gap > 24 * 7 {
                    bail!(
                        "{}:{line_no}: {gap} hours missing before this row (more than a week)",
                        path.display()
                    );
                }
                for step in 1..=gap {
                    let share = step as f64 / (gap + 1) as f64;
                    series.values.push(last + (value - last) * share);
                }
                series.filled += gap;
                series.values.push(value);
            }
        }
    }
    if series.values.is_empty() {
        bail!("{}: no data rows", path.display());
    }
    series.start_hour = first_hour.unwrap_or_default();
    Ok(series)
}

/// What an hourly grid file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridColumn {
    /// Electricity Maps' `Carbon Intensity gCO₂eq/kWh (direct)`.
    Carbon,
    /// `Price (USD/MWh)`.
    Price,
}

fn is_carbon_column(header: &str) -> bool {
    header.starts_with("Carbon Intensity") && header.ends_with("(direct)")
}

/// One hourly file in the format of `../shared/data` (Electricity Maps carbon, or
/// GreenDCC prices), whichever its header says.
pub fn load_grid_file(path: &Path) -> Result<(GridColumn, HourlySeries)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let header = text.lines().next().unwrap_or("");
    let zone = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.split('_').next())
        .unwrap_or("?")
        .to_string();
    let headers: Vec<&str> = header.split(',').map(str::trim).collect();
    if headers.iter().any(|h| is_carbon_column(h)) {
        Ok((
            GridColumn::Carbon,
            load_hourly(path, &zone, is_carbon_column, Some("Data Estimated"))?,
        ))
    } else if headers.contains(&"Price (USD/MWh)") {
        Ok((
            GridColumn::Price,
            load_hourly(path, &zone, |h| h == "Price (USD/MWh)", None)?,
        ))
    } else {
        bail!(
            "{}: no `Carbon Intensity gCO₂eq/kWh (direct)` or `Price (USD/MWh)` column in its header",
            path.display()
        )
    }
}

/// `carbon-intensity-hourly-2023/<zone>_2023_hourly.csv`, direct intensity (gCO₂eq/kWh).
pub fn load_carbon(data: &Path, zone: &str) -> Result<HourlySeries> {
    let path = data
        .join("carbon-intensity-hourly-2023")
        .join(format!("{zone}_2023_hourly.csv"));
    load_hourly(&path, zone, is_carbon_column, Some("Data Estimated"))
}

/// `electricity-prices-hourly-2023/<zone>_electricity_prices_2023.csv` (USD/MWh).
pub fn load_prices(data: &Path, zone: &str) -> Result<HourlySeries> {
    let path = data
        .join("electricity-prices-hourly-2023")
        .join(format!("{zone}_electricity_prices_2023.csv"));
    load_hourly(&path, zone, |h| h == "Price (USD/MWh)", None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_fills_gaps_counts_duplicates_and_names_bad_lines() {
        let dir = std::env::temp_dir().join(format!("nephele-carbon-{}", std::process::id()));
        let folder = dir.join("carbon-intensity-hourly-2023");
        std::fs::create_dir_all(&folder).expect("tmp");
        let header = "Datetime (UTC),Zone Id,Carbon Intensity gCO₂eq/kWh (direct),Data Estimated\n";
        let body = "2023-01-01 00:00:00,X,10,false\n2023-01-01 01:00:00,X,20,true\n2023-01-01 01:00:00,X,99,false\n2023-01-01 04:00:00,X,50,false\n";
        std::fs::write(folder.join("X_2023_hourly.csv"), format!("{header}{body}")).expect("tmp");
        let loaded = load_carbon(&dir, "X").expect("loads");
        assert_eq!(loaded.values, vec![10.0, 20.0, 30.0, 40.0, 50.0]);
        assert_eq!(
            (loaded.filled, loaded.duplicates, loaded.estimated),
            (2, 1, 1)
        );
        std::fs::write(
            folder.join("Y_2023_hourly.csv"),
            format!("{header}2023-01-01 00:00:00,Y,oops,false\n"),
        )
        .expect("tmp");
        let error = format!("{:#}", load_carbon(&dir, "Y").expect_err("bad value"));
        assert!(error.contains("Y_2023_hourly.csv:2"), "{error}");
        let missing = format!("{:#}", load_carbon(&dir, "Z").expect_err("missing"));
        assert!(missing.contains("--data"), "{missing}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn series_go_onto_a_fixed_grid() {
        let start = parse_utc_hour("2023-01-01 02").expect("ok");
        let series = HourlySeries {
            zone: "X".into(),
            start_hour: start,
            values: vec![1.0, 2.0, 3.0],
            filled: 0,
            duplicates: 0,
            estimated: 0,
        };
        let grid = series.on_grid("2023-01-01 00", 7).expect("grid");
        assert_eq!(grid, vec![1.0, 1.0, 1.0, 2.0, 3.0, 3.0, 3.0]);
        assert!(series.on_grid("garbage", 3).is_err());
    }

    #[test]
    fn timestamps_parse_as_utc_hours() {
        let start = parse_utc_hour("2023-01-01 00:00:00").expect("ok");
        assert_eq!(parse_utc_hour("2023-01-01 00:30:00+00:00"), Some(start));
        assert_eq!(parse_utc_hour("2023-07-01 00:00:00"), Some(start + 4344));
        assert_eq!(parse_utc_hour("2024-01-01 00:00:00"), Some(start + 8760));
        assert_eq!(parse_utc_hour("2023-01-01 01:00:00+01:00"), None);
        assert_eq!(parse_utc_hour("garbage"), None);
        assert_eq!(parse_utc_hour("2023-07-01T12:00Z"), Some(start + 4356));
        assert_eq!(parse_utc_hour("2023-07-01T12"), Some(start + 4356));
        assert_eq!(parse_utc_hour("2023-07-01X12:00"), None);
        for hour in [start, start + 4356, start + 8759, 0, 24 * 366 * 60 + 5] {
            assert_eq!(parse_utc_hour(&format_utc_hour(hour)), Some(hour), "{hour}");
        }
        assert_eq!(format_utc_hour(start + 4356), "2023-07-01 12:00");
    }

    #[test]
    fn grid_files_are_told_apart_by_their_header() {
        let dir = std::env::temp_dir().join(format!("nephele-gridfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let carbon = dir.join("XX_2023_hourly.csv");
        std::fs::write(
            &carbon,
            "Datetime (UTC),Carbon Intensity gCO₂eq/kWh (direct),Data Estimated\n2023-01-01 00:00:00,10,false\n2023-01-01 01:00:00,12,false\n",
        )
        .expect("write");
        let (kind, series) = load_grid_file(&carbon).expect("loads");
        assert_eq!(
            (kind, series.values.clone(), series.zone.as_str()),
            (GridColumn::Carbon, vec![10.0, 12.0], "XX")
        );
        let price = dir.join("XX_electricity_prices_2023.csv");
        std::fs::write(
            &price,
            "Datetime (UTC),Datetime (Local),Price (USD/MWh)\n2023-01-01 00:00:00+00:00,x,-3.5\n",
        )
        .expect("write");
        assert_eq!(load_grid_file(&price).expect("loads").0, GridColumn::Price);
        let other = dir.join("other.csv");
        std::fs::write(&other, "a,b\n1,2\n").expect("write");
        let error = load_grid_file(&other).expect_err("refused").to_string();
        assert!(error.contains("no `Carbon Intensity"), "{error}");
        assert!(load_grid_file(&dir.join("missing.csv")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Request arrivals of the Azure LLM inference trace (`azure-llm-inference-2023`), in
/// microseconds since the first request, sorted. Rows whose time does not parse are an
/// error naming the line.
pub fn load_azure_arrivals(data: &Path) -> Result<Vec<u64>> {
    let path = data
        .join("azure-llm-inference-2023")
        .join("AzureLLMInferenceTrace_code.csv");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut times = Vec::new();
    for (line_no, line) in text.lines().enumerate().skip(1) {
        let stamp = line.split(',').next().unwrap_or("");
        let micros = parse_utc_micros(stamp).with_context(|| {
            format!(
                "{}:{}: bad TIMESTAMP {stamp:?}",
                path.display(),
                line_no + 1
            )
        })?;
        times.push(micros);
    }
    times.sort_unstable();
    let Some(&first) = times.first() else {
        bail!("{}: no requests", path.display());
    };
    Ok(times.into_iter().map(|t| (t - first) as u64).collect())
}

/// `YYYY-MM-DD HH:MM:SS[.fffffff]` (UTC) as microseconds since 1970.
pub(crate) fn parse_utc_micros(text: &str) -> Option<i64> {
    let text = text.trim();
    let hour = parse_utc_hour(text.get(..13)?)?;
    let minute: i64 = text.get(14..16)?.parse().ok()?;
    let second: i64 = text.get(17..19)?.parse().ok()?;
    if text.get(13..14)? != ":"
        || text.get(16..17)? != ":"
        || !(0..=59).contains(&minute)
        || !(0..=60).contains(&second)
    {
        return None;
    }
    let fraction = match text.get(19..) {
        None | Some("") => 0,
        Some(rest) => {
            let digits = rest.strip_prefix('.')?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let padded = format!("{:0<6}", &digits[..digits.len().min(6)]);
            padded.parse::<i64>().ok()?
        }
    };
    Some(((hour * 60 + minute) * 60 + second) * 1_000_000 + fraction)
}

#[cfg(test)]
mod azure_tests {
    use super::*;

    #[test]
    fn trace_times_parse_to_microseconds() {
        let base = parse_utc_micros("2023-11-16 18:17:03").unwrap();
        assert_eq!(
            parse_utc_micros("2023-11-16 18:17:03.9799600").unwrap() - base,
            979_960
        );
        assert_eq!(
            parse_utc_micros("2023-11-16 18:17:04.03").unwrap() - base,
            1_030_000
        );
        for bad in [
            "",
            "2023-11-16 18:17",
            "2023-11-16 18:17:03.",
            "2023-11-16 18:61:03",
            "x",
        ] {
            assert_eq!(parse_utc_micros(bad), None, "{bad:?}");
        }
    }
}

#[cfg(test)]
mod pod_list_tests {
    use super::*;

    #[test]
    fn pod_lists_are_named_by_their_file_and_found_by_name_or_path() {
        let data = Path::new("/data");
        assert_eq!(
            pod_list_path(data, "gpuspec33"),
            Path::new("/data/alibaba-gpu-v2023/openb_pod_list_gpuspec33.csv")
        );
        assert_eq!(pod_list_path(data, "mine.csv"), Path::new("mine.csv"));
        assert_eq!(pod_list_path(data, "a/b"), Path::new("a/b"));
        assert_eq!(
            pod_list_name(Path::new("/x/openb_pod_list_gpushare40.csv")),
            "gpushare40"
        );
        assert_eq!(pod_list_name(Path::new("mine.csv")), "mine");
    }

    #[test]
    fn a_five_column_pod_list_loads_and_a_bad_value_is_named() {
        let dir = std::env::temp_dir().join(format!("nephele-podlist-{}", std::process::id()));
        let traces = dir.join("alibaba-gpu-v2023");
        std::fs::create_dir_all(&traces).unwrap();
        std::fs::write(
            traces.join("openb_node_list_gpu_node.csv"),
            "sn,cpu_milli,memory_mib,gpu,model\nn1,96000,786432,8,V100M16\n",
        )
        .unwrap();
        let five = traces.join("five.csv");
        std::fs::write(
            &five,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,4000,16384,1,500\np2,8000,1024,0,0\n",
        )
        .unwrap();
        let trace = load_openb_with(&dir, &five).unwrap();
        assert_eq!(trace.nodes.len(), 1);
        assert_eq!(trace.pods.len(), 2);
        assert_eq!((trace.pods[0].num_gpu, trace.pods[0].gpu_milli), (1, 500));
        assert_eq!((trace.pods[1].num_gpu, trace.pods[1].gpu_milli), (0, 0));
        assert!(trace.pods[0].gpu_models.is_empty());
        assert_eq!(trace.meta[0].creation, 0);

        let bad = traces.join("bad.csv");
        std::fs::write(
            &bad,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,lots,16384,1,500\n",
        )
        .unwrap();
        let error = format!("{:#}", load_openb_with(&dir, &bad).unwrap_err());
        assert!(
            error.contains("cpu_milli") && error.contains("lots"),
            "{error}"
        );

        let typo = traces.join("typo.csv");
        std::fs::write(
            &typo,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpuspec\np1,4000,16384,1,1000,V100M16\n",
        )
        .unwrap();
        let error = format!("{:#}", load_openb_with(&dir, &typo).unwrap_err());
        assert!(
            error.contains("unknown column \"gpuspec\"") && error.contains("gpu_spec"),
            "{error}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
