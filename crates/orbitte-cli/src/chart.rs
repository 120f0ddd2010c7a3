//! A small SVG line chart: throughput against block size for `bench --sweep`.
//!
//! Hand-written on purpose: one polyline per series on a log2 x axis is
//! about eighty lines, while a plotting crate would add a font stack and
//! hundreds of dependencies to a command-line tool.

use std::fmt::Write as _;

/// One line on the chart.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub(crate) name: String,
    /// (block size in bytes, GB/s)
    pub(crate) points: Vec<(u64, f64)>,
}

const W: f64 = 720.0;
const H: f64 = 420.0;
const ML: f64 = 70.0;
const MR: f64 = 150.0;
const MT: f64 = 40.0;
const MB: f64 = 60.0;
const COLORS: &[&str] = &["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];

/// Renders the series as an SVG document.
pub(crate) fn svg(title: &str, series: &[Series]) -> String {
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| (p.0.max(1) as f64).log2()))
        .collect();
    let (xmin, xmax) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    let (xmin, xmax) = if xs.is_empty() {
        (0.0, 1.0)
    } else {
        (xmin, xmax.max(xmin + 1.0))
    };
    let ymax = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    // Round numbers on the y axis: a step of 1, 2 or 5 times a power of
    // ten, four or five steps to the top.
    let step = nice_step(if ymax > 0.0 { ymax } else { 1.0 } / 4.0);
    let steps = (ymax / step).ceil().max(1.0) as u32;
    let ymax = step * f64::from(steps);
    let px = |x: f64| ML + (x - xmin) / (xmax - xmin) * (W - ML - MR);
    let py = |y: f64| H - MB - y / ymax * (H - MT - MB);

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="24" font-size="15">{}</text>"#,
        ML,
        escape(title)
    );
    let _ = writeln!(
        out,
        r#"<line x1="{ML}" y1="{0}" x2="{1}" y2="{0}" stroke="black"/><line x1="{ML}" y1="{MT}" x2="{ML}" y2="{0}" stroke="black"/>"#,
        H - MB,
        W - MR
    );
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10()).ceil() as usize
    };
    for i in 0..=steps {
        let y = step * f64::from(i);
        let (tx, ly, x2) = (ML - 6.0, py(y), W - MR);
        let _ = writeln!(
            out,
            r##"<text x="{tx}" y="{ty:.1}" text-anchor="end">{y:.decimals$}</text><line x1="{ML}" y1="{ly:.1}" x2="{x2}" y2="{ly:.1}" stroke="#ddd"/>"##,
            ty = ly + 4.0,
        );
    }
    // One tick per block size that was measured, none in between.
    let mut measured: Vec<u64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0.max(1)))
        .collect();
    measured.sort_unstable();
    measured.dedup();
    for b in measured {
        let x = px((b as f64).log2());
        let _ = writeln!(
            out,
            r#"<line x1="{x:.1}" y1="{0}" x2="{x:.1}" y2="{1}" stroke="black"/><text x="{x:.1}" y="{2}" text-anchor="middle">{3}</text>"#,
            H - MB,
            H - MB + 5.0,
            H - MB + 18.0,
            human_bytes(b)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">block size</text><text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">GB/s</text>"#,
        (ML + W - MR) / 2.0,
        H - 16.0,
        H / 2.0,
        H / 2.0
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|p| format!("{:.1},{:.1}", px((p.0.max(1) as f64).log2()), py(p.1)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        // A marker on every measured point, with its value on hover.
        for p in &s.points {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{color}"><title>{}: {} {:.3} GB/s</title></circle>"#,
                px((p.0.max(1) as f64).log2()),
                py(p.1),
                escape(&s.name),
                human_bytes(p.0),
                p.1
            );
        }
        let ly = MT + 20.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{2}" y="{3}">{4}</text>"#,
            W - MR + 10.0,
            W - MR + 30.0,
            W - MR + 35.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
    out.push_str("</svg>\n");
    out
}

/// The smallest of 1, 2 or 5 times a power of ten that is at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * p)
}

/// 65536 -> "64K", 1048576 -> "1M".
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: &[(u64, &str)] = &[(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for &(u, s) in UNITS {
        if n >= u && n.is_multiple_of(u) {
            return format!("{}{s}", n / u);
        }
    }
    n.to_string()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_has_one_polyline_per_series_and_labels() {
        let s = svg(
            "tcp <loopback>",
            &[
                Series {
                    name: "orbitte".into(),
                    points: vec![(4096, 1.0), (65536, 3.0)],
                },
                Series {
                    name: "raw socket".into(),
                    points: vec![(4096, 1.5), (65536, 3.5)],
                },
            ],
        );
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("tcp &lt;loopback&gt;"));
        assert!(s.contains(">64K<"));
        assert!(s.starts_with("<svg"));
        // A marker per measured point; ticks only at measured sizes.
        assert_eq!(s.matches("<circle").count(), 4);
        assert!(!s.contains(">8K<") && !s.contains(">32K<"), "{s}");
        // y ticks are round: 0, 1, 2, 3, 4 for a top of 3.5.
        for t in [">0<", ">1<", ">2<", ">3<", ">4<"] {
            assert!(s.contains(t), "{t}: {s}");
        }
    }

    #[test]
    fn y_steps_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(nice_step(0.8), 1.0);
        assert_eq!(nice_step(1.2), 2.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(0.03), 0.05);
        assert_eq!(nice_step(20.0), 20.0);
    }

    #[test]
    fn human_bytes_names_powers_of_two() {
        assert_eq!(human_bytes(65536), "64K");
        assert_eq!(human_bytes(1 << 20), "1M");
        assert_eq!(human_bytes(1000), "1000");
    }
}
