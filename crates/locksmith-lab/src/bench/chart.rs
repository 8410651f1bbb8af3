//! SVG charts of a run (plotters, SVG backend only, no font files needed).

use std::path::Path;

use plotters::prelude::*;

/// One backend's line on a chart.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points (x, y).
    pub points: Vec<(f64, f64)>,
}

/// Distinct colours, one per series in order.
const PALETTE: [RGBColor; 8] = [
    RGBColor(0xd6, 0x27, 0x28), // red: the first series, the reference
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];

/// Room to the right of the plot for the legend (pixels).
const LEGEND_WIDTH: u32 = 130;

/// Draws the legend in the margin right of the plot (plotters' own legend is
/// clipped to the plotting area, where it would hide lines).
fn draw_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    series: &[Series],
) -> Result<(), String> {
    let (width, _) = root.dim_in_pixel();
    let x = width as i32 - LEGEND_WIDTH as i32 + 10;
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let y = 60 + 22 * i as i32;
        root.draw(&PathElement::new(
            vec![(x, y), (x + 22, y)],
            color.stroke_width(3),
        ))
        .map_err(|e| e.to_string())?;
        root.draw(&Text::new(
            s.label.clone(),
            (x + 28, y - 7),
            ("sans-serif", 14),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn bounds(series: &[Series], pick: impl Fn(&(f64, f64)) -> f64) -> (f64, f64) {
    let values = series.iter().flat_map(|s| s.points.iter().map(&pick));
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        (1.0, 10.0)
    } else {
        (lo, hi)
    }
}

/// Rounds a positive range out to powers of ten, for log axes.
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let lo = 10f64.powf(lo.max(1e-3).log10().floor());
    let hi = 10f64.powf(hi.max(lo * 10.0).log10().ceil());
    (lo, hi)
}

/// An axis count in k and M: `500`, `20 k`, `1.5 M`.
fn fmt_count(value: f64) -> String {
    let (scaled, unit) = if value >= 1e6 {
        (value / 1e6, " M")
    } else if value >= 1e3 {
        (value / 1e3, " k")
    } else {
        (value, "")
    };
    let digits = if scaled.fract().abs() < 0.05 { 0 } else { 1 };
    format!("{scaled:.digits$}{unit}")
}

/// Throughput against concurrent clients, both axes logarithmic.
pub fn throughput(path: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    let (x_lo, x_hi) = bounds(series, |p| p.0);
    let (y_lo, y_hi) = bounds(series, |p| p.1);
    let (y_lo, y_hi) = decades(y_lo, y_hi);
    // Label exactly the client counts measured.
    let mut clients: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    clients.sort_by(f64::total_cmp);
    clients.dedup();
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .margin_right(LEGEND_WIDTH)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(
            (x_lo.max(1.0) * 0.8..x_hi * 1.25)
                .log_scale()
                .with_key_points(clients),
            (y_lo..y_hi).log_scale(),
        )
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("concurrent clients (each on its own lock)")
        .y_desc("acquire + release pairs / s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| fmt_count(*y))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    draw_legend(&root, series)?;
    root.present().map_err(|e| e.to_string())
}

/// Cumulative distributions of latencies (µs, logarithmic x axis).
pub fn cdf(path: &Path, title: &str, x_desc: &str, series: &[Series]) -> Result<(), String> {
    let (x_lo, x_hi) = bounds(series, |p| p.0);
    let (x_lo, x_hi) = decades(x_lo, x_hi);
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .margin_right(LEGEND_WIDTH)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), 0.0..1.0)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("fraction ≤ x")
        .x_label_formatter(&|x| super::stats::fmt_us(*x))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().map(|&(x, y)| (x.max(x_lo), y)),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?;
    }
    draw_legend(&root, series)?;
    root.present().map_err(|e| e.to_string())
}
