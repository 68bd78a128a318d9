//! When a variant may ship: its outputs judged against the full model's on the
//! validation rows, by a rule per output (`nephele model push --accept`).
//!
//! | rule                                   | an output passes when                                          |
//! |----------------------------------------|----------------------------------------------------------------|
//! | `cosine[:min=0.99]`                    | every row's cosine similarity with full is at least `min`      |
//! | `argmax[:min=0.99,axis=-1,from=0]`     | the class (argmax along `axis`, from index `from`) is the same at a share `min` of the positions |
//! | `topk:k=K[,min=0.99,axis,from]`        | each side's top class is among the other's top `K`, at a share `min` of the positions |
//! | `detections:score=S[,margin=0.01,min=0.99,axis,from]` | at a share `min` of the rows, every candidate scoring at least `S + margin` on one side scores at least `S`, with the same class, on the other |
//!
//! A rule is written `[OUTPUT=]KIND[:KEY=VALUE,...]`; a bare number is the kind's main
//! parameter (`topk:5`, `detections:0.4`, `cosine:0.995`). A rule naming an output
//! judges that output; a rule naming none judges each float output that no rule names.
//! With no rule at all, the outputs no rule names are judged together by the default,
//! `cosine:min=0.99` over their concatenation (what every push got before `--accept`).
//! `axis` is the class axis of the output's shape as the model answers it, batch
//! included (YOLOv8's `[1, 84, 8400]` is `axis=1,from=4`: four box values, then 80
//! class scores).

use std::fmt;
use std::str::FromStr;

/// The default share of positions (or rows) that must agree under argmax, top-k and
/// detections rules.
pub const DEFAULT_SHARE: f64 = 0.99;
/// The default minimum cosine (the rule every variant had before `--accept`).
pub const DEFAULT_MIN_COSINE: f64 = 0.99;
/// A candidate must be found on the other side only when it scores at least this above
/// the threshold: one a hair above may fall a hair below without changing the answer
/// (the band the zoo's task check, `zoo_task.py`, leaves too).
pub const DEFAULT_MARGIN: f64 = 0.01;

/// How one output is compared with full's.
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    Cosine {
        min: f64,
    },
    Argmax {
        min: f64,
        axis: isize,
        from: usize,
    },
    TopK {
        k: usize,
        min: f64,
        axis: isize,
        from: usize,
    },
    Detections {
        score: f64,
        margin: f64,
        min: f64,
        axis: isize,
        from: usize,
    },
}

/// One `--accept`: a rule, for one output or (without a name) for each output no rule
/// names.
#[derive(Debug, Clone, PartialEq)]
pub struct Accept {
    pub output: Option<String>,
    pub rule: Rule,
}

const KINDS: [&str; 4] = ["cosine", "argmax", "topk", "detections"];

fn usage() -> &'static str {
    "give [OUTPUT=]KIND[:KEY=VALUE,...] with KIND cosine (min), argmax (min, axis, from), topk (k, min, axis, from) or detections (score, margin, min, axis, from), e.g. argmax, topk:5, scores=detections:score=0.5"
}

impl FromStr for Accept {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        // The rule starts at the first kind that opens the text or follows an `=`, and
        // is followed by `:` or the end (an output may be named `argmax`, or `a:0`).
        let start = (0..text.len())
            .filter(|&i| text.is_char_boundary(i) && (i == 0 || text[..i].ends_with('=')))
            .find(|&i| {
                KINDS.iter().any(|kind| {
                    text[i..]
                        .strip_prefix(kind)
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
                })
            })
            .ok_or_else(|| format!("accept rule {text:?}: no rule kind found; {}", usage()))?;
        let output = (start > 0).then(|| text[..start - 1].trim().to_string());
        if output.as_deref() == Some("") {
            return Err(format!(
                "accept rule {text:?}: empty output name before '='"
            ));
        }
        let (kind, params) = match text[start..].split_once(':') {
            Some((kind, params)) => (kind, params),
            None => (&text[start..], ""),
        };
        let mut values: Vec<(String, String)> = Vec::new();
        for (i, part) in params
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .enumerate()
        {
            match part.split_once('=') {
                Some((key, value)) => values.push((key.trim().into(), value.trim().into())),
                // A bare number first: the kind's main parameter.
                None if i == 0 => {
                    let main = match kind {
                        "topk" => "k",
                        "detections" => "score",
                        _ => "min",
                    };
                    values.push((main.into(), part.trim().into()));
                }
                None => {
                    return Err(format!(
                        "accept rule {text:?}: {part:?} is not KEY=VALUE; {}",
                        usage()
                    ))
                }
            }
        }
        let rule =
            build_rule(kind, &values).map_err(|why| format!("accept rule {text:?}: {why}"))?;
        Ok(Accept { output, rule })
    }
}

fn build_rule(kind: &str, values: &[(String, String)]) -> Result<Rule, String> {
    let allowed: &[&str] = match kind {
        "cosine" => &["min"],
        "argmax" => &["min", "axis", "from"],
        "topk" => &["k", "min", "axis", "from"],
        _ => &["score", "margin", "min", "axis", "from"],
    };
    for (key, _) in values {
        if !allowed.contains(&key.as_str()) {
            return Err(format!("{kind} takes {}, not {key:?}", allowed.join(", ")));
        }
    }
    let get = |key: &str| {
        values
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let float = |key: &str, default: Option<f64>| -> Result<f64, String> {
        match get(key) {
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| format!("{key}={v} is not a number")),
            None => default.ok_or_else(|| format!("{kind} needs {key}=")),
        }
    };
    let share = |key: &str, default: f64| -> Result<f64, String> {
        let value = float(key, Some(default))?;
        if value > 0.0 && value <= 1.0 {
            Ok(value)
        } else {
            Err(format!("{key}={value} must be in (0, 1]"))
        }
    };
    let axis = match get("axis") {
        Some(v) => v
            .parse::<isize>()
            .map_err(|_| format!("axis={v} is not an integer"))?,
        None => -1,
    };
    let from = match get("from") {
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| format!("from={v} is not a count"))?,
        None => 0,
    };
    Ok(match kind {
        "cosine" => {
            let min = float("min", Some(DEFAULT_MIN_COSINE))?;
            if !(-1.0..=1.0).contains(&min) {
                return Err(format!("min={min} must be in [-1, 1]"));
            }
            Rule::Cosine { min }
        }
        "argmax" => Rule::Argmax {
            min: share("min", DEFAULT_SHARE)?,
            axis,
            from,
        },
        "topk" => {
            let k = match get("k") {
                Some(v) => v.parse::<usize>().ok().filter(|k| *k >= 1),
                None => None,
            }
            .ok_or("topk needs k=1 or more")?;
            Rule::TopK {
                k,
                min: share("min", DEFAULT_SHARE)?,
                axis,
                from,
            }
        }
        _ => {
            let margin = float("margin", Some(DEFAULT_MARGIN))?;
            if margin < 0.0 {
                return Err(format!("margin={margin} must not be negative"));
            }
            Rule::Detections {
                score: float("score", None)?,
                margin,
                min: share("min", DEFAULT_SHARE)?,
                axis,
                from,
            }
        }
    })
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Cosine { min } => write!(f, "cosine:min={min}"),
            Rule::Argmax { min, axis, from } => {
                write!(f, "argmax:min={min},axis={axis},from={from}")
            }
            Rule::TopK { k, min, axis, from } => {
                write!(f, "topk:k={k},min={min},axis={axis},from={from}")
            }
            Rule::Detections {
                score,
                margin,
                min,
                axis,
                from,
            } => write!(
                f,
                "detections:score={score},margin={margin},min={min},axis={axis},from={from}"
            ),
        }
    }
}

impl fmt::Display for Accept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.output {
            Some(output) => write!(f, "{output}={}", self.rule),
            None => write!(f, "{}", self.rule),
        }
    }
}

/// One output of one row's answer: its name, shape (batch included) and values.
#[derive(Debug, Clone, Copy)]
pub struct Values<'a> {
    pub name: &'a str,
    pub shape: &'a [usize],
    pub data: &'a [f32],
}

/// What a rule measured on one output (or the default's group of outputs).
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub passes: bool,
    /// The rule, the output(s) and the figure, e.g. "argmax on `logits`: 64/64 positions agree (100.0%, rule ≥ 99.0%)".
    pub text: String,
}

/// A variant's outputs judged by every rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub parts: Vec<Part>,
    /// The smallest cosine of any row on any output judged, whatever the rules (what
    /// the model view's `min_cosine` shows).
    pub min_cosine: f64,
}

impl Verdict {
    pub fn passes(&self) -> bool {
        self.parts.iter().all(|p| p.passes)
    }

    /// Every part, `; `-joined: what the variant was accepted (or refused) on.
    pub fn summary(&self) -> String {
        self.parts
            .iter()
            .map(|p| p.text.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The parts that fail, `; `-joined; `None` when it passes.
    pub fn failures(&self) -> Option<String> {
        let failed: Vec<&str> = self
            .parts
            .iter()
            .filter(|p| !p.passes)
            .map(|p| p.text.as_str())
            .collect();
        (!failed.is_empty()).then(|| failed.join("; "))
    }
}

/// Checks that every output a rule names is one of `outputs` (`model`'s float
/// outputs), so a typo is refused before anything is built.
pub fn check_outputs(
    model: &str,
    accepts: &[Accept],
    outputs: &[&str],
) -> Result<(), crate::RuntimeError> {
    for accept in accepts {
        if let Some(name) = &accept.output {
            if !outputs.contains(&name.as_str()) {
                return Err(crate::RuntimeError::BadInput {
                    model: model.to_string(),
                    cause: format!(
                        "--accept {accept}: the model has no float output {name:?}; its float outputs are {}",
                        outputs.join(", ")
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The cosine similarity of two outputs (1 when both are all zeros, 0 when only one
/// is or their lengths differ).
pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 && nb == 0.0 {
        1.0
    } else if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na.sqrt() * nb.sqrt())
    }
}

/// The vectors along `axis` of an output (each position's class scores, from index
/// `from`); the whole output as one vector when its shape does not describe its values.
fn vectors(values: &Values, axis: isize, from: usize) -> Vec<Vec<f32>> {
    let shape = values.shape;
    let count: usize = shape.iter().product();
    let rank = shape.len() as isize;
    let axis = if axis < 0 { rank + axis } else { axis };
    if shape.is_empty() || count != values.data.len() || !(0..rank).contains(&axis) {
        return vec![values.data.iter().skip(from).copied().collect()];
    }
    let axis = axis as usize;
    let length = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut found = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            found.push(
                (from.min(length)..length)
                    .map(|j| values.data[(o * length + j) * inner + i])
                    .collect(),
            );
        }
    }
    found
}

/// The index and value of the largest entry (the first of equals; NaN never wins).
pub(crate) fn top(values: &[f32]) -> (usize, f32) {
    values
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, v)| {
            if *v > best.1 {
                (i, *v)
            } else {
                best
            }
        })
}

/// The indices of the `k` largest entries.
fn top_k(values: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|a, b| values[*b].total_cmp(&values[*a]).then(a.cmp(b)));
    order.truncate(k);
    order
}

fn percent(share: f64) -> String {
    format!("{:.1}%", 100.0 * share)
}

/// Judges `candidate` against `reference`, row by row (each row: the float outputs of
/// one answer, in the model's output order), by `accepts` (see the module's table).
pub fn judge(accepts: &[Accept], reference: &[Vec<Values>], candidate: &[Vec<Values>]) -> Verdict {
    let names: Vec<&str> = reference
        .first()
        .map(|row| row.iter().map(|v| v.name).collect())
        .unwrap_or_default();
    let unnamed: Vec<&Rule> = accepts
        .iter()
        .filter(|a| a.output.is_none())
        .map(|a| &a.rule)
        .collect();
    let mut parts = Vec::new();
    let mut grouped = Vec::new();
    for (index, name) in names.iter().enumerate() {
        let named: Vec<&Rule> = accepts
            .iter()
            .filter(|a| a.output.as_deref() == Some(*name))
            .map(|a| &a.rule)
            .collect();
        let rules = if named.is_empty() { &unnamed } else { &named };
        if rules.is_empty() {
            grouped.push(index);
        }
        for rule in rules {
            parts.push(judge_output(rule, name, index, reference, candidate));
        }
    }
    let mut min_cosine = f64::INFINITY;
    for (want, got) in reference.iter().zip(candidate) {
        for (a, b) in want.iter().zip(got) {
            min_cosine = min_cosine.min(cosine(a.data, b.data));
        }
    }
    if !grouped.is_empty() {
        // The default: the outputs no rule names, together.
        let flat = |row: &Vec<Values>| -> Vec<f32> {
            grouped
                .iter()
                .filter_map(|i| row.get(*i))
                .flat_map(|v| v.data.iter().copied())
                .collect()
        };
        let worst = reference
            .iter()
            .zip(candidate)
            .map(|(a, b)| cosine(&flat(a), &flat(b)))
            .fold(f64::INFINITY, f64::min);
        let rows = reference.len().min(candidate.len());
        let which = if grouped.len() == names.len() {
            String::new()
        } else {
            let listed: Vec<String> = grouped.iter().map(|i| format!("`{}`", names[*i])).collect();
            format!(" on {}", listed.join(", "))
        };
        parts.push(if rows == 0 {
            Part {
                passes: false,
                text: "no rows to compare".into(),
            }
        } else {
            Part {
                passes: worst >= DEFAULT_MIN_COSINE,
                text: format!(
                    "min cosine {worst:.4}{which} over {rows} rows (rule ≥ {DEFAULT_MIN_COSINE})"
                ),
            }
        });
    }
    Verdict {
        parts,
        min_cosine: if min_cosine.is_finite() {
            min_cosine
        } else {
            0.0
        },
    }
}

fn judge_output(
    rule: &Rule,
    name: &str,
    index: usize,
    reference: &[Vec<Values>],
    candidate: &[Vec<Values>],
) -> Part {
    let pairs: Vec<(&Values, &Values)> = reference
        .iter()
        .zip(candidate)
        .filter_map(|(a, b)| Some((a.get(index)?, b.get(index)?)))
        .collect();
    if pairs.is_empty() {
        return Part {
            passes: false,
            text: format!("{rule} on `{name}`: no rows to compare"),
        };
    }
    match rule {
        Rule::Cosine { min } => {
            let worst = pairs
                .iter()
                .map(|(a, b)| cosine(a.data, b.data))
                .fold(f64::INFINITY, f64::min);
            Part {
                passes: worst >= *min,
                text: format!(
                    "min cosine {worst:.4} on `{name}` over {} rows (rule ≥ {min})",
                    pairs.len()
                ),
            }
        }
        Rule::Argmax { min, axis, from }
        | Rule::TopK {
            min, axis, from, ..
        } => {
            let k = match rule {
                Rule::TopK { k, .. } => *k,
                _ => 1,
            };
            let (mut same, mut total) = (0usize, 0usize);
            for (a, b) in &pairs {
                let (want, got) = (vectors(a, *axis, *from), vectors(b, *axis, *from));
                for (w, g) in want.iter().zip(&got) {
                    total += 1;
                    let agrees = if k == 1 {
                        w.len() == g.len() && top(w).0 == top(g).0
                    } else {
                        top_k(w, k).contains(&top(g).0) && top_k(g, k).contains(&top(w).0)
                    };
                    same += usize::from(agrees);
                }
            }
            let share = same as f64 / total.max(1) as f64;
            let what = if k == 1 {
                "argmax".to_string()
            } else {
                format!("top-{k}")
            };
            Part {
                passes: total > 0 && share >= *min,
                text: format!(
                    "{what} on `{name}`: {same}/{total} positions agree ({}, rule ≥ {})",
                    percent(share),
                    percent(*min)
                ),
            }
        }
        Rule::Detections {
            score,
            margin,
            min,
            axis,
            from,
        } => {
            let (mut rows_same, mut found_want, mut found_got, mut changed_class) =
                (0usize, 0usize, 0usize, 0usize);
            for (a, b) in &pairs {
                let (want, got) = (vectors(a, *axis, *from), vectors(b, *axis, *from));
                let mut row_same = want.len() == got.len();
                for (w, g) in want.iter().zip(&got) {
                    let ((wc, ws), (gc, gs)) = (top(w), top(g));
                    let (ws, gs) = (f64::from(ws), f64::from(gs));
                    found_want += usize::from(ws >= *score);
                    found_got += usize::from(gs >= *score);
                    // Clearly found on either side: found on the other, same class.
                    if ws >= score + margin || gs >= score + margin {
                        if ws < *score || gs < *score {
                            row_same = false;
                        } else if wc != gc {
                            row_same = false;
                            changed_class += 1;
                        }
                    }
                }
                rows_same += usize::from(row_same);
            }
            let share = rows_same as f64 / pairs.len() as f64;
            Part {
                passes: share >= *min,
                text: format!(
                    "detections ≥ {score} on `{name}`: {rows_same}/{} rows with the same candidates and classes ({}, rule ≥ {}; {found_want} vs {found_got} candidates, {changed_class} changed class; a candidate within {margin} above the score need not be found on the other side)",
                    pairs.len(),
                    percent(share),
                    percent(*min)
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rows<'a>(name: &'a str, shape: &'a [usize], data: &'a [Vec<f32>]) -> Vec<Vec<Values<'a>>> {
        data.iter()
            .map(|d| {
                vec![Values {
                    name,
                    shape,
                    data: d,
                }]
            })
            .collect()
    }

    #[test]
    fn rules_parse_with_names_defaults_and_a_bare_main_parameter() {
        let a: Accept = "argmax".parse().expect("argmax");
        assert_eq!(a.output, None);
        assert_eq!(
            a.rule,
            Rule::Argmax {
                min: DEFAULT_SHARE,
                axis: -1,
                from: 0
            }
        );
        let t: Accept = "logits=topk:5".parse().expect("topk");
        assert_eq!(t.output.as_deref(), Some("logits"));
        assert!(matches!(t.rule, Rule::TopK { k: 5, .. }));
        let d: Accept = "output0=detections:score=0.25,axis=1,from=4"
            .parse()
            .expect("det");
        assert_eq!(d.output.as_deref(), Some("output0"));
        assert_eq!(
            d.rule,
            Rule::Detections {
                score: 0.25,
                margin: DEFAULT_MARGIN,
                min: DEFAULT_SHARE,
                axis: 1,
                from: 4
            }
        );
        // Output names with ':' (TensorFlow's) and named like a kind.
        let tf: Accept = "Identity:0=cosine:0.995".parse().expect("tf");
        assert_eq!(tf.output.as_deref(), Some("Identity:0"));
        assert_eq!(tf.rule, Rule::Cosine { min: 0.995 });
        let odd: Accept = "argmax=cosine".parse().expect("odd name");
        assert_eq!(odd.output.as_deref(), Some("argmax"));
        // Displayed in full, and read back the same.
        for rule in [a, t, d, tf, odd] {
            assert_eq!(
                rule.to_string().parse::<Accept>().expect("round trip"),
                rule
            );
        }
    }

    #[test]
    fn bad_rules_say_what_to_write() {
        for (text, says) in [
            ("median", "no rule kind"),
            ("topk", "k=1 or more"),
            ("topk:k=0", "k=1 or more"),
            ("argmax:min=1.5", "(0, 1]"),
            ("argmax:bins=3", "takes min, axis, from"),
            ("detections", "needs score="),
            ("detections:score=x", "not a number"),
            ("=argmax", "empty output name"),
            ("cosine:0.9,0.8", "not KEY=VALUE"),
        ] {
            let error = text.parse::<Accept>().expect_err(text);
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    #[test]
    fn argmax_accepts_what_cosine_refuses_and_the_other_way_round() {
        // Scores scaled and shifted: cosine drops, every class stays.
        let shape = [1, 3];
        let full = vec![vec![0.1, 0.5, 0.2], vec![0.6, 0.1, 0.0]];
        let shifted = vec![vec![2.1, 2.6, 2.2], vec![2.9, 2.1, 2.0]];
        let (want, got) = (rows("p", &shape, &full), rows("p", &shape, &shifted));
        let by_cosine = judge(&[], &want, &got);
        assert!(!by_cosine.passes(), "{}", by_cosine.summary());
        let argmax = judge(&["argmax".parse().expect("rule")], &want, &got);
        assert!(argmax.passes(), "{}", argmax.summary());
        assert!(
            argmax.summary().contains("2/2 positions"),
            "{}",
            argmax.summary()
        );
        // A flipped class with a high cosine: cosine passes, argmax does not.
        let near = vec![vec![0.1, 0.5, 0.2], vec![0.6, 0.1, 0.0]];
        let flipped = vec![vec![0.1, 0.5, 0.2], vec![0.6, 0.61, 0.0]];
        let (want, got) = (rows("p", &shape, &near), rows("p", &shape, &flipped));
        let argmax = judge(&["p=argmax".parse().expect("rule")], &want, &got);
        assert!(!argmax.passes());
        assert!(
            argmax.failures().expect("fails").contains("1/2"),
            "{}",
            argmax.summary()
        );
        let top2 = judge(&["p=topk:2".parse().expect("rule")], &want, &got);
        assert!(top2.passes(), "{}", top2.summary());
    }

    #[test]
    fn detections_count_candidates_and_classes_on_the_class_axis() {
        // [1, 2 + 2 classes, 3 candidates]: rows 0..2 are box values, skipped by from=2.
        let shape = [1, 4, 3];
        let full = vec![vec![
            9.0, 9.0, 9.0, // x
            9.0, 9.0, 9.0, // y
            0.9, 0.1, 0.3, // class 0
            0.05, 0.8, 0.1, // class 1
        ]];
        let rule: Accept = "detections:score=0.5,axis=1,from=2".parse().expect("rule");
        // Boxes moved, scores within the rule: same.
        let mut moved = full.clone();
        moved[0][0] = 1.0;
        let verdict = judge(
            std::slice::from_ref(&rule),
            &rows("o", &shape, &full),
            &rows("o", &shape, &moved),
        );
        assert!(verdict.passes(), "{}", verdict.summary());
        // The second candidate changes class: refused, counted.
        let mut changed = full.clone();
        changed[0][7] = 0.85;
        changed[0][10] = 0.2;
        let verdict = judge(
            std::slice::from_ref(&rule),
            &rows("o", &shape, &full),
            &rows("o", &shape, &changed),
        );
        assert!(!verdict.passes(), "{}", verdict.summary());
        assert!(
            verdict.summary().contains("1 changed class"),
            "{}",
            verdict.summary()
        );
        // A candidate found clearly on one side must be found on the other.
        let mut lost = full.clone();
        lost[0][6] = 0.49;
        let verdict = judge(
            std::slice::from_ref(&rule),
            &rows("o", &shape, &full),
            &rows("o", &shape, &lost),
        );
        assert!(!verdict.passes(), "{}", verdict.summary());
        // A candidate crossing the threshold by a hair is not counted.
        let mut hair = full.clone();
        hair[0][8] = 0.505;
        let verdict = judge(
            &[rule],
            &rows("o", &shape, &full),
            &rows("o", &shape, &hair),
        );
        assert!(verdict.passes(), "{}", verdict.summary());
    }

    #[test]
    fn named_outputs_get_their_rule_and_the_rest_the_default() {
        let shape = [1, 2];
        let want: Vec<Vec<Values>> = vec![vec![
            Values {
                name: "a",
                shape: &shape,
                data: &[1.0, 0.0],
            },
            Values {
                name: "b",
                shape: &shape,
                data: &[0.0, 1.0],
            },
        ]];
        let got: Vec<Vec<Values>> = vec![vec![
            Values {
                name: "a",
                shape: &shape,
                data: &[5.0, 4.0],
            },
            Values {
                name: "b",
                shape: &shape,
                data: &[0.0, 1.0],
            },
        ]];
        let verdict = judge(&["a=argmax".parse().expect("rule")], &want, &got);
        assert!(verdict.passes(), "{}", verdict.summary());
        assert!(
            verdict.summary().contains("on `b`"),
            "{}",
            verdict.summary()
        );
        assert!(verdict.min_cosine < 0.8);
        assert!(
            check_outputs("m", &["c=argmax".parse().expect("rule")], &["a", "b"])
                .expect_err("no c")
                .to_string()
                .contains("a, b")
        );
    }

    proptest! {
        #[test]
        fn a_variant_equal_to_full_passes_every_rule(
            data in proptest::collection::vec(proptest::collection::vec(-5.0f32..5.0, 12), 1..6),
            k in 1usize..4,
            score in 0.0f64..1.0,
        ) {
            let shape = [1, 3, 4];
            let want = rows("o", &shape, &data);
            for text in ["cosine", "argmax", "argmax:axis=1", &format!("topk:{k}"),
                         &format!("detections:score={score},axis=1,from=1")] {
                let verdict = judge(&[text.parse().expect("rule")], &want, &want);
                prop_assert!(verdict.passes(), "{}: {}", text, verdict.summary());
            }
        }

        #[test]
        fn argmax_agreement_is_the_share_of_positions_whose_class_stays(
            data in proptest::collection::vec(proptest::collection::vec(0.0f32..1.0, 8), 1..6),
            flips in proptest::collection::vec(any::<bool>(), 12),
        ) {
            // Two positions of four classes a row; a flip moves a position's top class.
            let shape = [2, 4];
            let mut flipped = data.clone();
            let mut expected_same = 0;
            for (r, row) in flipped.iter_mut().enumerate() {
                for p in 0..2 {
                    let v = &mut row[p * 4..p * 4 + 4];
                    let (best, _) = top(v);
                    if flips[(r * 2 + p) % flips.len()] {
                        let other = (best + 1) % 4;
                        v[other] = v[best] + 1.0;
                    } else {
                        expected_same += 1;
                    }
                }
            }
            let verdict = judge(&["argmax:min=0.01".parse().expect("rule")],
                                &rows("o", &shape, &data), &rows("o", &shape, &flipped));
            let total = data.len() * 2;
            let says = format!("{expected_same}/{total} positions");
            prop_assert!(verdict.summary().contains(&says), "{} vs {}", verdict.summary(), says);
        }
    }
}
