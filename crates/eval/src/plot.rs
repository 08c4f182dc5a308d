//! A small SVG line chart: one polyline with markers per series, axes with ticks, a legend.
//! Enough for `sift sweep`'s Pareto plots without a plotting dependency.

use std::fmt::Write;

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    pub series: Vec<Series>,
}

const COLORS: [&str; 9] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"];

fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| span / s <= n as f64).unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(t);
        t += step;
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

impl Chart {
    pub fn to_svg(&self) -> String {
        let (w, h) = (720.0, 460.0);
        let (l, r, t, b) = (70.0, 170.0, 40.0, 55.0);
        let pts: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .collect();
        let fy = |y: f64| if self.log_y { y.max(1e-12).log10() } else { y };
        let (mut x0, mut x1) =
            pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let (mut y0, mut y1) =
            pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(fy(p.1)), b.max(fy(p.1))));
        if !x0.is_finite() {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        let padx = ((x1 - x0) * 0.05).max(1e-9);
        let pady = ((y1 - y0) * 0.05).max(1e-9);
        (x0, x1, y0, y1) = (x0 - padx, x1 + padx, y0 - pady, y1 + pady);
        let sx = |x: f64| l + (x - x0) / (x1 - x0) * (w - l - r);
        let sy = |y: f64| h - b - (fy(y) - y0) / (y1 - y0) * (h - t - b);
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
            (l + w - r) / 2.0,
            esc(&self.title)
        );
        let _ = writeln!(
            s,
            r#"<rect x="{l}" y="{t}" width="{}" height="{}" fill="none" stroke="black"/>"#,
            w - l - r,
            h - t - b
        );
        for xt in nice_ticks(x0, x1, 8) {
            let x = sx(xt);
            let _ = writeln!(
                s,
                r##"<line x1="{x}" y1="{}" x2="{x}" y2="{t}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
                h - b,
                h - b + 16.0,
                fmt_num(xt)
            );
        }
        let yt: Vec<f64> = if self.log_y {
            let v: Vec<f64> = nice_ticks(10f64.powf(y0), 10f64.powf(y1), 8);
            v.into_iter().filter(|&y| y > 0.0).collect()
        } else {
            nice_ticks(y0, y1, 8)
        };
        for y in yt {
            let yy = sy(y);
            if yy < t - 1.0 || yy > h - b + 1.0 {
                continue;
            }
            let _ = writeln!(
                s,
                r##"<line x1="{l}" y1="{yy}" x2="{}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                w - r,
                l - 6.0,
                yy + 4.0,
                fmt_num(y)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            (l + w - r) / 2.0,
            h - 12.0,
            esc(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (t + h - b) / 2.0,
            esc(&self.y_label)
        );
        for (i, se) in self.series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            let mut p = se.points.clone();
            p.sort_by(|a, b| a.0.total_cmp(&b.0));
            let path: Vec<String> = p
                .iter()
                .filter(|q| q.0.is_finite() && q.1.is_finite())
                .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
                .collect();
            let _ =
                writeln!(s, r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="1.8"/>"#, path.join(" "));
            for q in &path {
                let (x, y) = q.split_once(',').unwrap_or(("0", "0"));
                let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="3" fill="{c}"/>"#);
            }
            let ly = t + 14.0 + i as f64 * 18.0;
            let _ = writeln!(
                s,
                r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
                w - r + 12.0,
                w - r + 32.0,
                w - r + 38.0,
                ly + 4.0,
                esc(&se.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
