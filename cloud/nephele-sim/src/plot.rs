//! Plain SVG line plots (no plotting dependency).

/// A line plot of one or more curves over arrived demand 0..=130%.
pub fn svg_plot(curves: &[(String, Vec<(u32, f64)>)]) -> String {
    let (width, height, left, bottom) = (720.0, 420.0, 60.0, 40.0);
    let x = |level: f64| left + level / 130.0 * (width - left - 20.0);
    let max_y = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|(_, v)| *v))
        .fold(10.0f64, f64::max)
        .ceil();
    let y = |value: f64| height - bottom - value / max_y * (height - bottom - 20.0);
    let colours = [
        "#888", "#8c564b", "#1f77b4", "#9467bd", "#ff7f0e", "#2ca02c", "#d62728",
    ];
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n"
    );
    svg += &format!(
        "<line x1='{left}' y1='{}' x2='{}' y2='{}' stroke='black'/>\n",
        y(0.0),
        x(130.0),
        y(0.0)
    );
    svg += &format!(
        "<line x1='{left}' y1='{}' x2='{left}' y2='{}' stroke='black'/>\n",
        y(0.0),
        y(max_y)
    );
    for level in (0..=130).step_by(10) {
        svg += &format!(
            "<text x='{}' y='{}' text-anchor='middle'>{level}</text>\n",
            x(f64::from(level)),
            y(0.0) + 16.0
        );
    }
    for tick in 0..=5 {
        let value = max_y * f64::from(tick) / 5.0;
        svg += &format!(
            "<text x='{}' y='{}' text-anchor='end'>{value:.0}</text>\n",
            left - 6.0,
            y(value) + 4.0
        );
    }
    svg += &format!(
        "<text x='{}' y='{}' text-anchor='middle'>arrived GPU demand (% of capacity)</text>\n",
        (left + width) / 2.0,
        height - 4.0
    );
    svg += &format!("<text x='14' y='{}' transform='rotate(-90 14 {})' text-anchor='middle'>unallocated GPU (% of capacity)</text>\n", height / 2.0, height / 2.0);
    for (idx, (name, curve)) in curves.iter().enumerate() {
        let colour = colours[idx % colours.len()];
        let points: Vec<String> = curve
            .iter()
            .map(|(l, v)| format!("{:.1},{:.1}", x(f64::from(*l)), y(*v)))
            .collect();
        svg += &format!(
            "<polyline fill='none' stroke='{colour}' stroke-width='1.5' points='{}'/>\n",
            points.join(" ")
        );
        svg += &format!(
            "<text x='{}' y='{}' fill='{colour}'>{name}</text>\n",
            width - 130.0,
            30.0 + 15.0 * idx as f64
        );
    }
    svg + "</svg>\n"
}

/// One curve of [`svg_xy`]: `colour` indexes a fixed palette; `dashed` draws it dashed;
/// an empty `name` leaves it out of the legend.
#[derive(Debug, Clone)]
pub struct XyLine {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub colour: usize,
    pub dashed: bool,
}

/// A generic line plot: axes scaled to the data (the y axis always includes 0).
pub fn svg_xy(title: &str, x_label: &str, y_label: &str, lines: &[XyLine]) -> String {
    let (width, height, left, right, bottom, top) = (760.0, 440.0, 60.0, 150.0, 40.0, 30.0);
    let points = || lines.iter().flat_map(|l| l.points.iter().copied());
    let (min_x, max_x) = points().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (x, _)| {
        (lo.min(x), hi.max(x))
    });
    let (min_x, max_x) = if min_x.is_finite() && max_x > min_x {
        (min_x, max_x)
    } else {
        (0.0, 1.0)
    };
    let max_y = points().map(|(_, y)| y).fold(1.0f64, f64::max).ceil();
    let min_y = points().map(|(_, y)| y).fold(0.0f64, f64::min).floor();
    let x = |v: f64| left + (v - min_x) / (max_x - min_x) * (width - left - right);
    let y = |v: f64| height - bottom - (v - min_y) / (max_y - min_y) * (height - bottom - top);
    let colours = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    ];
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n<text x='{left}' y='18'>{title}</text>\n"
    );
    svg += &format!(
        "<line x1='{left}' y1='{0}' x2='{1}' y2='{0}' stroke='black'/>\n<line x1='{left}' y1='{0}' x2='{left}' y2='{2}' stroke='black'/>\n",
        y(min_y),
        x(max_x),
        y(max_y)
    );
    let mut ticks: Vec<f64> = points().map(|(v, _)| v).collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for tick in ticks {
        svg += &format!(
            "<text x='{}' y='{}' text-anchor='middle'>{tick}</text>\n",
            x(tick),
            y(min_y) + 16.0
        );
    }
    for step in 0..=5 {
        let value = min_y + (max_y - min_y) * f64::from(step) / 5.0;
        svg += &format!(
            "<text x='{}' y='{}' text-anchor='end'>{value:.1}</text>\n",
            left - 6.0,
            y(value) + 4.0
        );
    }
    svg += &format!(
        "<text x='{}' y='{}' text-anchor='middle'>{x_label}</text>\n",
        (left + width - right) / 2.0,
        height - 4.0
    );
    svg += &format!(
        "<text x='14' y='{0}' transform='rotate(-90 14 {0})' text-anchor='middle'>{y_label}</text>\n",
        height / 2.0
    );
    let mut legend = 0.0;
    for line in lines {
        let colour = colours[line.colour % colours.len()];
        let dash = if line.dashed {
            " stroke-dasharray='5,4'"
        } else {
            ""
        };
        let coords: Vec<String> = line
            .points
            .iter()
            .map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b)))
            .collect();
        svg += &format!(
            "<polyline fill='none' stroke='{colour}' stroke-width='1.5'{dash} points='{}'/>\n",
            coords.join(" ")
        );
        if !line.name.is_empty() {
            svg += &format!(
                "<text x='{}' y='{}' fill='{colour}'>{}</text>\n",
                width - right + 10.0,
                top + 10.0 + 15.0 * legend,
                line.name
            );
            legend += 1.0;
        }
    }
    svg + "</svg>\n"
}

/// A line plot of named (x, y) curves with labelled axes; both axes start at 0 and end
/// at the largest value (at least 1), so any series fits.
pub fn svg_lines(curves: &[(String, Vec<(f64, f64)>)], x_label: &str, y_label: &str) -> String {
    let (width, height, left, bottom) = (720.0, 420.0, 60.0, 40.0);
    let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
    let max_x = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|(x, _)| finite(*x)))
        .fold(1.0f64, f64::max);
    let max_y = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|(_, y)| finite(*y)))
        .fold(1.0f64, f64::max)
        .ceil();
    let x = |v: f64| left + finite(v) / max_x * (width - left - 20.0);
    let y = |v: f64| height - bottom - finite(v) / max_y * (height - bottom - 20.0);
    let colours = [
        "#888", "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e", "#8c564b",
    ];
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n"
    );
    svg += &format!(
        "<line x1='{left}' y1='{}' x2='{}' y2='{}' stroke='black'/>\n",
        y(0.0),
        x(max_x),
        y(0.0)
    );
    svg += &format!(
        "<line x1='{left}' y1='{}' x2='{left}' y2='{}' stroke='black'/>\n",
        y(0.0),
        y(max_y)
    );
    for tick in 0..=5 {
        let xv = max_x * f64::from(tick) / 5.0;
        svg += &format!(
            "<text x='{}' y='{}' text-anchor='middle'>{xv:.0}</text>\n",
            x(xv),
            y(0.0) + 16.0
        );
        let yv = max_y * f64::from(tick) / 5.0;
        svg += &format!(
            "<text x='{}' y='{}' text-anchor='end'>{yv:.0}</text>\n",
            left - 6.0,
            y(yv) + 4.0
        );
    }
    svg += &format!(
        "<text x='{}' y='{}' text-anchor='middle'>{}</text>\n",
        (left + width) / 2.0,
        height - 4.0,
        escape(x_label)
    );
    svg += &format!(
        "<text x='14' y='{}' transform='rotate(-90 14 {})' text-anchor='middle'>{}</text>\n",
        height / 2.0,
        height / 2.0,
        escape(y_label)
    );
    for (idx, (name, curve)) in curves.iter().enumerate() {
        let colour = colours[idx % colours.len()];
        let points: Vec<String> = curve
            .iter()
            .map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b)))
            .collect();
        svg += &format!(
            "<polyline fill='none' stroke='{colour}' stroke-width='1.2' points='{}'/>\n",
            points.join(" ")
        );
        svg += &format!(
            "<text x='{}' y='{}' fill='{colour}' text-anchor='end'>{}</text>\n",
            width - 24.0,
            30.0 + 15.0 * idx as f64,
            escape(name)
        );
    }
    svg + "</svg>\n"
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
}

/// One group of [`svg_bars`]: a label (a pod list) and, per series (a policy), a value
/// and its spread (drawn as an error bar); `None` leaves the bar out.
#[derive(Debug, Clone)]
pub struct BarGroup {
    pub label: String,
    pub bars: Vec<Option<(f64, f64)>>,
}

/// A grouped bar chart like the FGD paper's study figures: one group per pod list, one
/// bar per policy (mean ± sd), a legend of `series` names.
pub fn svg_bars(title: &str, y_label: &str, series: &[String], groups: &[BarGroup]) -> String {
    let (width, height, left, bottom, top) = (860.0, 420.0, 60.0, 40.0, 50.0);
    let max_y = groups
        .iter()
        .flat_map(|g| g.bars.iter().flatten().map(|(v, sd)| v + sd))
        .fold(1.0f64, f64::max);
    let max_y = (max_y / 5.0).ceil() * 5.0;
    let plot_w = width - left - 20.0;
    let y = |value: f64| height - bottom - value / max_y * (height - bottom - top);
    let colours = [
        "#888", "#8c564b", "#1f77b4", "#9467bd", "#e377c2", "#ff7f0e", "#2ca02c", "#d62728",
        "#17becf",
    ];
    let group_w = plot_w / groups.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n<text x='{}' y='18' text-anchor='middle' font-size='14'>{title}</text>\n",
        width / 2.0
    );
    for tick in 0..=5 {
        let value = max_y * f64::from(tick) / 5.0;
        svg += &format!(
            "<line x1='{left}' y1='{0:.1}' x2='{1:.1}' y2='{0:.1}' stroke='#ddd'/>\n<text x='{2}' y='{3:.1}' text-anchor='end'>{value:.0}</text>\n",
            y(value),
            left + plot_w,
            left - 6.0,
            y(value) + 4.0
        );
    }
    svg += &format!("<text x='14' y='{0}' transform='rotate(-90 14 {0})' text-anchor='middle'>{y_label}</text>\n", (height - bottom + top) / 2.0);
    for (g, group) in groups.iter().enumerate() {
        let x0 = left + g as f64 * group_w + group_w * 0.1;
        for (s, bar) in group.bars.iter().enumerate() {
            let Some((value, sd)) = bar else { continue };
            let x = x0 + s as f64 * bar_w;
            let colour = colours[s % colours.len()];
            svg += &format!(
                "<rect x='{x:.1}' y='{:.1}' width='{:.1}' height='{:.1}' fill='{colour}'><title>{}: {value:.2} ± {sd:.2}</title></rect>\n",
                y(*value),
                bar_w * 0.9,
                y(0.0) - y(*value),
                series.get(s).map_or("", String::as_str)
            );
            let mid = x + bar_w * 0.45;
            svg += &format!(
                "<line x1='{mid:.1}' y1='{:.1}' x2='{mid:.1}' y2='{:.1}' stroke='black'/>\n",
                y(value - sd),
                y(value + sd)
            );
        }
        svg += &format!(
            "<text x='{:.1}' y='{}' text-anchor='middle'>{}</text>\n",
            x0 + group_w * 0.4,
            height - bottom + 16.0,
            group.label
        );
    }
    svg += &format!(
        "<line x1='{left}' y1='{0:.1}' x2='{1:.1}' y2='{0:.1}' stroke='black'/>\n",
        y(0.0),
        left + plot_w
    );
    for (s, name) in series.iter().enumerate() {
        let x = left + 10.0 + (s % 5) as f64 * 150.0;
        let row = 30.0 + (s / 5) as f64 * 14.0;
        svg += &format!(
            "<rect x='{x}' y='{}' width='10' height='10' fill='{}'/><text x='{}' y='{row}'>{name}</text>\n",
            row - 9.0,
            colours[s % colours.len()],
            x + 14.0
        );
    }
    svg + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_draw_one_rect_per_value_and_skip_missing_ones() {
        let series = vec!["fgd".to_string(), "ours".to_string()];
        let groups = vec![
            BarGroup {
                label: "default".into(),
                bars: vec![Some((4.8, 0.1)), Some((4.6, 0.1))],
            },
            BarGroup {
                label: "gpuspec33".into(),
                bars: vec![Some((12.1, 0.2)), None],
            },
        ];
        let svg = svg_bars("study", "unallocated GPU %", &series, &groups);
        // Three bars, two legend swatches, the background.
        assert_eq!(svg.matches("<rect").count(), 3 + 2 + 1);
        assert!(svg.contains("ours: 4.60 ± 0.10"));
        assert!(svg.contains(">gpuspec33<"));
    }
}
