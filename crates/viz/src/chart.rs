//! Line and bar charts drawn with plotters, each written as PNG and SVG. The text uses the
//! embedded DejaVu Sans (registered once), so a chart's bytes do not depend on the fonts a
//! machine happens to have.

use std::path::{Path, PathBuf};
use std::sync::Once;

use anyhow::{anyhow, Context, Result};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
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

/// Colours told apart by people with any kind of colour vision (Okabe and Ito), yellow
/// last: it is the faintest on white.
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(213, 94, 0),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(240, 228, 66),
];

/// The colour of series `i`.
fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// A y axis whose positive values span more than this factor is drawn on a log scale.
const LOG_SPAN: f64 = 20.0;

fn draw_lines<DB: DrawingBackend>(c: &LineChart, root: &DrawingArea<DB, Shift>) -> Result<()> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    let points = || c.series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = span(points().map(|p| p.0), false);
    let finite_y = || points().map(|p| p.1).filter(|y| y.is_finite());
    let lo = finite_y().fold(f64::INFINITY, f64::min);
    let hi = finite_y().fold(f64::NEG_INFINITY, f64::max);
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(&c.title, (FAMILY, 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(80);
    if lo > 0.0 && hi / lo > LOG_SPAN {
        let (y0, y1) = (lo / 1.2, hi * 1.2);
        let corner = legend_corner(c, (x0, x1), (y0.ln(), y1.ln()), f64::ln);
        let chart = builder
            .build_cartesian_2d(x0..x1, (y0..y1).log_scale())
            .map_err(e)?;
        fill_lines(c, chart, &format!("{} (log scale)", c.y_label), corner)
    } else {
        // Zero is on the axis when it is near the data (counts, rates); a figure that
        // moves in a narrow band far from it (AUC, log loss) gets the band.
        let (y0, y1) = span(finite_y(), lo <= hi - lo);
        let corner = legend_corner(c, (x0, x1), (y0, y1), |y| y);
        let chart = builder.build_cartesian_2d(x0..x1, y0..y1).map_err(e)?;
        fill_lines(c, chart, &c.y_label, corner)
    }
}

/// Draws the mesh (labelled axes, ticks without float noise), the lines and the legend
/// of `c` on `chart`, whichever scale its y axis has.
fn fill_lines<'a, DB, Y>(
    c: &LineChart,
    mut chart: ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    y_label: &str,
    corner: SeriesLabelPosition,
) -> Result<()>
where
    DB: DrawingBackend + 'a,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    chart
        .configure_mesh()
        .x_desc(&c.x_label)
        .y_desc(y_label)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style((FAMILY, 14))
        .draw()
        .map_err(e)?;
    for (i, s) in c.series.iter().enumerate() {
        let color = colour(i);
        let finite: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|p| p.1.is_finite())
            .collect();
        let line: Vec<(f64, f64)> = if c.steps {
            let mut v = Vec::with_capacity(2 * finite.len());
            for (k, &(x, y)) in finite.iter().enumerate() {
                if k > 0 {
                    v.push((x, finite[k - 1].1));
                }
                v.push((x, y));
            }
            v
        } else {
            finite.clone()
        };
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(e)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        if c.steps || finite.len() < 50 {
            chart
                .draw_series(finite.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(e)?;
        }
    }
    if c.series.len() > 1 {
        chart
            .configure_series_labels()
            .label_font((FAMILY, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(corner)
            .draw()
            .map_err(e)?;
    }
    Ok(())
}

/// The corner of the plot the legend hides the fewest points in: the points in the
/// outer 40% of the width and 35% of the height there (`scale` maps a y value to the
/// axis's own scale).
fn legend_corner(
    c: &LineChart,
    (x0, x1): (f64, f64),
    (y0, y1): (f64, f64),
    scale: impl Fn(f64) -> f64,
) -> SeriesLabelPosition {
    let at = |(x, y): (f64, f64)| ((x - x0) / (x1 - x0), (scale(y) - y0) / (y1 - y0));
    let points: Vec<(f64, f64)> = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|p| p.1.is_finite())
        .map(at)
        .collect();
    let crowd = |right: bool, top: bool| {
        points
            .iter()
            .filter(|&&(x, y)| {
                (if right { x > 0.6 } else { x < 0.4 }) && (if top { y > 0.65 } else { y < 0.35 })
            })
            .count()
    };
    [
        (SeriesLabelPosition::LowerRight, crowd(true, false)),
        (SeriesLabelPosition::UpperRight, crowd(true, true)),
        (SeriesLabelPosition::LowerLeft, crowd(false, false)),
        (SeriesLabelPosition::UpperLeft, crowd(false, true)),
    ]
    .into_iter()
    .min_by_key(|c| c.1)
    .map_or(SeriesLabelPosition::LowerRight, |c| c.0)
}

/// A tick label a person reads: thousands grouped (`5,000,000`, not `5000000.0`), at most
/// four decimals, no trailing zeros.
pub fn tick(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let a = v.abs();
    if a >= 1000.0 {
        let n = v.round() as i64;
        let digits = n.unsigned_abs().to_string();
        let mut grouped = String::new();
        for (i, ch) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(ch);
        }
        return if n < 0 {
            format!("-{grouped}")
        } else {
            grouped
        };
    }
    let decimals = if a >= 100.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        4
    };
    let text = format!("{v:.decimals$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    };
    if text == "-0" {
        "0".into()
    } else {
        text
    }
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
        .y_label_formatter(&|v| tick(*v))
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
            let color = colour(i);
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
                tick(*v),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A y axis over more than 20x is drawn on a log scale and says so; one in a narrow
    /// band keeps a linear axis.
    #[test]
    fn a_wide_span_gets_a_log_axis() {
        let dir = tempfile::tempdir().unwrap();
        let chart = |ys: &[f64]| {
            Chart::Line(LineChart {
                title: "t".into(),
                x_label: "seconds".into(),
                y_label: "samples/s".into(),
                series: vec![Series {
                    name: "rate".into(),
                    points: ys.iter().enumerate().map(|(i, &y)| (i as f64, y)).collect(),
                }],
                steps: false,
            })
        };
        save(
            &chart(&[10.0, 100.0, 5000.0]),
            dir.path(),
            "wide",
            &[Format::Svg],
        )
        .unwrap();
        save(
            &chart(&[0.7, 0.72, 0.75]),
            dir.path(),
            "narrow",
            &[Format::Svg],
        )
        .unwrap();
        let wide = std::fs::read_to_string(dir.path().join("wide.svg")).unwrap();
        let narrow = std::fs::read_to_string(dir.path().join("narrow.svg")).unwrap();
        assert!(wide.contains("samples/s (log scale)"), "{wide}");
        assert!(!narrow.contains("log scale") && narrow.contains("samples/s"));
    }

    #[test]
    fn ticks_read_as_a_person_writes_them() {
        for (v, want) in [
            (5_000_000.0, "5,000,000"),
            (1000.0, "1,000"),
            (-25_000.0, "-25,000"),
            (250.0, "250"),
            (12.5, "12.5"),
            (0.70000001, "0.7"),
            (0.1 + 0.2, "0.3"),
            (0.0, "0"),
            (-0.00001, "0"),
            (2.25, "2.25"),
        ] {
            assert_eq!(tick(v), want, "{v}");
        }
    }
}
