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
