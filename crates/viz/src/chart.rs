//! Line and bar charts drawn with plotters, each written as PNG and SVG. The text uses the
//! embedded DejaVu Sans (registered once), so a chart's bytes do not depend on the fonts a
//! machine happens to have.

use std::path::{Path, PathBuf};
use std::sync::Once;

use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// DejaVu Sans (Bitstream Vera license, `assets/DejaVuSans-LICENSE.txt`).
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";
/// Pixels of a chart.
const SIZE: (u32, u32) = (900, 520);

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is ours and valid; a failure would be a build error in disguise.
        if plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_err() {
            tracing::error!("the embedded chart font did not load");
        }
    });
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A raster image.
    Png,
    /// A vector image.
    Svg,
}

impl Format {
    fn ext(self) -> &'static str {
        match self {
            Format::Png => "png",
            Format::Svg => "svg",
        }
    }
}

/// One named line of (x, y) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A chart of lines over a shared x axis.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    /// Caption.
    pub title: String,
    /// Axis descriptions.
    pub x_label: String,
    /// See `x_label`.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
    /// Draw each line as steps (a count that holds until it changes) and mark its points.
    pub steps: bool,
}

/// A chart of one bar per label.
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    /// Caption.
    pub title: String,
    /// Axis description.
    pub y_label: String,
    /// (label, value) per bar.
    pub bars: Vec<(String, f64)>,
}

/// A chart of either kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Chart {
    /// See [`LineChart`].
    Line(LineChart),
    /// See [`BarChart`].
    Bar(BarChart),
}

/// Writes `chart` as `dir/name.<ext>` in every format; returns the paths.
pub fn save(chart: &Chart, dir: &Path, name: &str, formats: &[Format]) -> Result<Vec<PathBuf>> {
    register_font();
    let mut out = Vec::new();
    for &f in formats {
        let path = dir.join(format!("{name}.{}", f.ext()));
        let drawn = match f {
            Format::Png => draw(chart, BitMapBackend::new(&path, SIZE).into_drawing_area()),
            Format::Svg => draw(chart, SVGBackend::new(&path, SIZE).into_drawing_area()),
        };
        drawn.with_context(|| format!("drawing {}", path.display()))?;
        out.push(path);
    }
    Ok(out)
}

fn draw<DB: DrawingBackend>(chart: &Chart, root: DrawingArea<DB, Shift>) -> Result<()> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    root.fill(&WHITE).map_err(e)?;
    match chart {
        Chart::Line(c) => draw_lines(c, &root)?,
        Chart::Bar(c) => draw_bars(c, &root)?,
    }
    root.present().map_err(e)
}

/// Range of `values` with a margin, never empty.
fn span(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if hi - lo < 1e-9 {
        hi = lo + 1.0;
    }
    let pad = (hi - lo) * 0.05;
    (if from_zero && lo >= 0.0 { lo } else { lo - pad }, hi + pad)
}

fn draw_lines<DB: DrawingBackend>(c: &LineChart, root: &DrawingArea<DB, Shift>) -> Result<()> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    let points = || c.series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = span(points().map(|p| p.0), false);
    let (y0, y1) = span(points().map(|p| p.1), true);
    let mut chart = ChartBuilder::on(root)
        .caption(&c.title, (FAMILY, 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(&c.x_label)
        .y_desc(&c.y_label)
        .label_style((FAMILY, 14))
        .draw()
        .map_err(e)?;
    for (i, s) in c.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let line: Vec<(f64, f64)> = if c.steps {
            let mut v = Vec::with_capacity(2 * s.points.len());
            for (k, &(x, y)) in s.points.iter().enumerate() {
                if k > 0 {
                    v.push((x, s.points[k - 1].1));
                }
                v.push((x, y));
            }
            v
        } else {
            s.points.clone()
        };
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(e)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        if c.steps || s.points.len() < 50 {
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(e)?;
        }
    }
    if c.series.len() > 1 {
        chart
            .configure_series_labels()
            .label_font((FAMILY, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(e)?;
    }
    Ok(())
}

fn draw_bars<DB: DrawingBackend>(c: &BarChart, root: &DrawingArea<DB, Shift>) -> Result<()> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    let (_, y1) = span(c.bars.iter().map(|b| b.1), true);
    let n = c.bars.len().max(1);
    let labels: Vec<String> = c.bars.iter().map(|b| b.0.clone()).collect();
    let mut chart = ChartBuilder::on(root)
        .caption(&c.title, (FAMILY, 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d((0..n).into_segmented(), 0.0..y1)
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(&c.y_label)
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .label_style((FAMILY, 14))
        .draw()
        .map_err(e)?;
    chart
        .draw_series(c.bars.iter().enumerate().map(|(i, (_, v))| {
            let color = Palette99::pick(i).to_rgba();
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), *v),
                ],
                color.filled(),
            );
            bar.set_margin(0, 0, 12, 12);
            bar
        }))
        .map_err(e)?;
    chart
        .draw_series(c.bars.iter().enumerate().map(|(i, (_, v))| {
            Text::new(
                format_value(*v),
                (SegmentValue::CenterOf(i), *v),
                (FAMILY, 14)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )
        }))
        .map_err(e)?;
    Ok(())
}

/// A value as a bar's label: few digits, no exponent for everyday sizes.
fn format_value(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}
