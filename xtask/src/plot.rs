//! The SVG plot: bandwidth and one-way latency (medians) against message size, softrdma and
//! the peers, two panels side by side.
//!
//! plotters draws with its SVG backend only and no font library: SVG text is laid out by the
//! viewer, plotters only estimates its size.

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::data::{Dataset, Series};
use crate::report::sr;
use crate::stats::{median, short_size};

/// How a line's points are marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// A filled circle (softrdma).
    Dot,
    /// A hollow circle.
    Ring,
    /// A triangle.
    Triangle,
    /// A cross.
    Cross,
}

/// One series of the plot: its medians by message size and how it is drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// The legend's text.
    pub label: String,
    /// The colour, RGB.
    pub color: (u8, u8, u8),
    /// softrdma's own series are drawn thicker.
    pub softrdma: bool,
    /// Dashed (shared memory and memcpy: not a network path).
    pub dashed: bool,
    /// Whether the points are joined (false: points only).
    pub joined: bool,
    /// The marker.
    pub marker: Marker,
    /// (message size in bytes, median), ascending by size; only finite, positive medians.
    /// Empty for a series that failed at every size (it is only named in the legend).
    pub points: Vec<(u64, f64)>,
}

struct Style {
    label: &'static str,
    color: (u8, u8, u8),
    marker: Marker,
    dashed: bool,
    joined: bool,
}

const WRITE: (u8, u8, u8) = (214, 39, 40);
const READ: (u8, u8, u8) = (255, 127, 14);
const SEND: (u8, u8, u8) = (148, 103, 189);
const UCX_PUT: (u8, u8, u8) = (31, 119, 180);
const UCX_TAG: (u8, u8, u8) = (23, 190, 207);
const UCX_AM: (u8, u8, u8) = (0, 90, 110);
const UCX_POSIX: (u8, u8, u8) = (44, 160, 44);
const FI_TCP: (u8, u8, u8) = (140, 86, 75);
const FI_UDP: (u8, u8, u8) = (188, 189, 34);
const FI_SHM: (u8, u8, u8) = (227, 119, 194);
const DARK: (u8, u8, u8) = (40, 40, 40);
const GREY: (u8, u8, u8) = (140, 140, 140);

const fn style(label: &'static str, color: (u8, u8, u8), marker: Marker) -> Style {
    Style {
        label,
        color,
        marker,
        dashed: false,
        joined: true,
    }
}

const fn shm(mut s: Style) -> Style {
    s.dashed = true;
    s
}

const fn points_only(mut s: Style) -> Style {
    s.joined = false;
    s
}

fn bandwidth_specs() -> Vec<(Series<'static>, Style)> {
    use Marker::*;
    vec![
        (sr("write_bw", "bw"), style("softrdma RC WRITE", WRITE, Dot)),
        (sr("read_bw", "bw"), style("softrdma RC READ", READ, Dot)),
        (sr("send_bw", "bw"), style("softrdma RC SEND", SEND, Dot)),
        (
            Series::new("ucx_perftest", "tcp", "ucp_put_bw", "bw"),
            style("UCX tcp put_bw", UCX_PUT, Triangle),
        ),
        (
            Series::new("ucx_perftest", "tcp", "tag_bw", "bw"),
            style("UCX tcp tag_bw", UCX_TAG, Triangle),
        ),
        (
            Series::new("ucx_perftest", "tcp", "ucp_am_bw", "bw"),
            style("UCX tcp am_bw", UCX_AM, Triangle),
        ),
        (
            Series::new("ucx_perftest", "posix", "ucp_put_bw", "bw"),
            shm(style("UCX posix put_bw (shm)", UCX_POSIX, Triangle)),
        ),
        (
            Series::new("fi_pingpong", "tcp", "pingpong", "bw"),
            style("libfabric tcp pingpong", FI_TCP, Ring),
        ),
        (
            Series::new("fi_pingpong", "shm", "pingpong", "bw"),
            shm(style("libfabric shm pingpong", FI_SHM, Ring)),
        ),
        (
            Series::new("memcpy_bw", "self", "memcpy", "bw"),
            shm(points_only(style("memcpy (1 thread)", DARK, Cross))),
        ),
    ]
}

fn latency_specs() -> Vec<(Series<'static>, Style)> {
    use Marker::*;
    vec![
        (
            sr("send_lat", "lat_p50"),
            style("softrdma RC SEND", SEND, Dot),
        ),
        (
            sr("write_lat", "lat_p50"),
            style("softrdma RC WRITE", WRITE, Dot),
        ),
        (
            Series::new("ucx_perftest", "tcp", "tag_lat", "lat_p50"),
            style("UCX tcp tag_lat", UCX_TAG, Triangle),
        ),
        (
            Series::new("ucx_perftest", "tcp", "ucp_put_lat", "lat_p50"),
            style("UCX tcp put_lat", UCX_PUT, Triangle),
        ),
        (
            Series::new("ucx_perftest", "posix", "tag_lat", "lat_p50"),
            shm(style("UCX posix tag_lat (shm)", UCX_POSIX, Triangle)),
        ),
        (
            Series::new("fi_pingpong", "tcp", "pingpong", "lat"),
            style("libfabric tcp pingpong", FI_TCP, Ring),
        ),
        (
            Series::new("fi_pingpong", "udp", "pingpong", "lat"),
            style("libfabric udp pingpong", FI_UDP, Ring),
        ),
        (
            Series::new("fi_pingpong", "shm", "pingpong", "lat"),
            shm(style("libfabric shm pingpong", FI_SHM, Ring)),
        ),
        (
            Series::new("sockperf", "tcp", "pingpong", "lat_p50"),
            points_only(style("sockperf tcp", DARK, Cross)),
        ),
        (
            Series::new("sockperf", "udp", "pingpong", "lat_p50"),
            points_only(style("sockperf udp", GREY, Cross)),
        ),
    ]
}

/// Message sizes the x axis can show (larger or zero sizes are left out of the plot).
const PLOT_SIZES: std::ops::RangeInclusive<u64> = 1..=1 << 40;
/// Values the log y axes can show (GB/s, µs); others (zero, negative, absurd) are left out.
const PLOT_VALUES: std::ops::RangeInclusive<f64> = 1e-9..=1e12;

fn lines(d: &Dataset, specs: Vec<(Series<'static>, Style)>) -> Vec<Line> {
    specs
        .into_iter()
        .filter_map(|(series, st)| {
            let points: Vec<(u64, f64)> = d
                .sizes(series)
                .into_iter()
                .filter(|s| PLOT_SIZES.contains(s))
                .filter_map(|s| {
                    median(&d.samples(series, s).values)
                        .filter(|m| PLOT_VALUES.contains(m))
                        .map(|m| (s, m))
                })
                .collect();
            // A series that was run but failed at every size stays in the legend.
            let failed = points.is_empty()
                && d.sizes(series)
                    .into_iter()
                    .any(|s| d.samples(series, s).is_failed());
            (!points.is_empty() || failed).then(|| Line {
                label: if failed {
                    format!("{} (failed)", st.label)
                } else {
                    st.label.to_string()
                },
                color: st.color,
                softrdma: series.tool == crate::report::SR_TOOL,
                dashed: st.dashed,
                joined: st.joined,
                marker: st.marker,
                points,
            })
        })
        .collect()
}

/// The bandwidth panel's lines (GB/s medians).
pub fn bandwidth_lines(d: &Dataset) -> Vec<Line> {
    lines(d, bandwidth_specs())
}

/// The latency panel's lines (one-way p50 medians, µs).
pub fn latency_lines(d: &Dataset) -> Vec<Line> {
    lines(d, latency_specs())
}

/// The x range in log2 of the size: softrdma's sizes, and at least 8 B to 1 MiB.
fn x_range(all: &[&[Line]]) -> (i32, i32) {
    let (mut lo, mut hi) = (3, 20);
    for l in all.iter().flat_map(|ls| ls.iter()).filter(|l| l.softrdma) {
        for &(s, _) in &l.points {
            let e = (s as f64).log2().round() as i32;
            lo = lo.min(e);
            hi = hi.max(e);
        }
    }
    (lo, hi)
}

/// A log y range with some room around the values, widened to 1-2-5 ticks so that both ends
/// are labelled, and to a factor of 10 at least.
fn y_range(lines: &[Line], x: (i32, i32)) -> (f64, f64) {
    let vals: Vec<f64> = visible(lines, x)
        .flat_map(|(_, p)| p)
        .map(|(_, v)| v)
        .collect();
    let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !(lo.is_finite() && hi.is_finite()) {
        return (0.1, 10.0);
    }
    let (mut lo, mut hi) = (lo / 1.25, hi * 1.25);
    if hi / lo < 10.0 {
        let mid = (lo * hi).sqrt();
        (lo, hi) = (mid / 10f64.sqrt(), mid * 10f64.sqrt());
    }
    (snap(lo, false), snap(hi, true))
}

/// The nearest 1, 2 or 5 × 10^k below (or above) `v`.
fn snap(v: f64, up: bool) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return v;
    }
    let k = v.log10().floor() as i32;
    let p = 10f64.powi(k);
    let m = v / p;
    let steps = [1.0, 2.0, 5.0, 10.0];
    let chosen = if up {
        steps
            .iter()
            .copied()
            .find(|&s| s >= m - 1e-9)
            .unwrap_or(10.0)
    } else {
        steps
            .iter()
            .rev()
            .copied()
            .find(|&s| s <= m + 1e-9)
            .unwrap_or(1.0)
    };
    chosen * p
}

/// The points of each line inside the x range, as (log2 size, value).
fn visible(lines: &[Line], x: (i32, i32)) -> impl Iterator<Item = (&Line, Vec<(f64, f64)>)> {
    lines.iter().map(move |l| {
        let pts = l
            .points
            .iter()
            .map(|&(s, v)| ((s as f64).log2(), v))
            .filter(|&(e, _)| e >= f64::from(x.0) - 0.01 && e <= f64::from(x.1) + 0.01)
            .collect();
        (l, pts)
    })
}

/// 1, 2, 5 × 10^k inside the range (the labelled grid of a log axis), and 1..9 × 10^k (the
/// light grid).
fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let (mut bold, mut light) = (Vec::new(), Vec::new());
    if !(lo > 0.0 && hi.is_finite() && lo <= hi) {
        return (bold, light);
    }
    let first = (lo.log10().floor() as i32).clamp(-40, 40);
    let last = (hi.log10().ceil() as i32).clamp(-40, 40);
    for k in first..=last {
        for m in 1..10 {
            // Divide for negative powers: 3 / 10 is 0.3, 3 * 0.1 is not.
            let v = if k < 0 {
                f64::from(m) / 10f64.powi(-k)
            } else {
                f64::from(m) * 10f64.powi(k)
            };
            if v < lo * (1.0 - 1e-9) || v > hi * (1.0 + 1e-9) {
                continue;
            }
            if [1, 2, 5].contains(&m) {
                bold.push(v);
            } else {
                light.push(v);
            }
        }
    }
    (bold, light)
}

/// A y label: `0.05`, `2`, `500`.
fn y_label(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn rgb(c: (u8, u8, u8)) -> RGBColor {
    RGBColor(c.0, c.1, c.2)
}

fn line_style(l: &Line) -> ShapeStyle {
    ShapeStyle {
        color: rgb(l.color).to_rgba(),
        filled: false,
        stroke_width: if l.softrdma { 4 } else { 2 },
    }
}

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("drawing the plot: {e:?}")
}

/// Draws a line's marker at `at` (a data coordinate on the chart, a pixel in the legend).
fn draw_marker<DB: DrawingBackend, CT: CoordTranslate>(
    area: &DrawingArea<DB, CT>,
    at: CT::From,
    l: &Line,
) -> Result<(), String>
where
    CT::From: Clone,
{
    let c = rgb(l.color);
    let at = EmptyElement::at(at);
    match l.marker {
        Marker::Dot => area.draw(&(at + Circle::new((0, 0), 5, c.filled()))),
        Marker::Ring => area.draw(&(at + Circle::new((0, 0), 4, c.stroke_width(2)))),
        Marker::Triangle => {
            area.draw(&(at + Polygon::new(vec![(0, -6), (-5, 4), (5, 4)], c.filled())))
        }
        Marker::Cross => area.draw(
            &(at + PathElement::new(vec![(-5, -5), (5, 5)], c.stroke_width(2))
                + PathElement::new(vec![(-5, 5), (5, -5)], c.stroke_width(2))),
        ),
    }
    .map_err(err)
}

/// Draws one panel: the chart on top, its legend below.
fn panel(
    area: &Area<'_>,
    title: &str,
    y_desc: &str,
    lines: &[Line],
    x: (i32, i32),
    legend_h: u32,
) -> Result<(), String> {
    let (w, h) = area.dim_in_pixel();
    let (chart_area, legend_area) = area.split_vertically(h.saturating_sub(legend_h));
    let (ylo, yhi) = y_range(lines, x);
    let (bold, light) = log_ticks(ylo, yhi);
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .margin_right(24)
        .x_label_area_size(52)
        .y_label_area_size(64)
        .build_cartesian_2d(
            f64::from(x.0) - 0.4..f64::from(x.1) + 0.4,
            (ylo..yhi)
                .log_scale()
                .with_key_points(bold)
                .with_light_points(light),
        )
        .map_err(err)?;
    let x_fmt = |e: &f64| {
        let r = e.round();
        if (e - r).abs() < 1e-6 && (0.0..63.0).contains(&r) {
            short_size(1u64 << (r as u32))
        } else {
            String::new()
        }
    };
    let y_fmt = |v: &f64| y_label(*v);
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc(y_desc)
        .x_labels((x.1 - x.0 + 1) as usize)
        .x_max_light_lines(0)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 15))
        .bold_line_style(RGBColor(200, 200, 200).stroke_width(1))
        .light_line_style(RGBColor(235, 235, 235).stroke_width(1))
        .draw()
        .map_err(err)?;

    if lines.iter().all(|l| l.points.is_empty()) {
        let (cw, ch) = chart_area.dim_in_pixel();
        chart_area
            .draw(&Text::new(
                "no data in the CSV",
                (cw as i32 / 2, ch as i32 / 2),
                TextStyle::from(("sans-serif", 18).into_font())
                    .pos(Pos::new(HPos::Center, VPos::Center)),
            ))
            .map_err(err)?;
    }
    // Peers first, softrdma on top.
    let mut order: Vec<(&Line, Vec<(f64, f64)>)> = visible(lines, x).collect();
    order.sort_by_key(|(l, _)| l.softrdma);
    for (l, pts) in &order {
        if l.joined && pts.len() > 1 {
            if l.dashed {
                chart
                    .draw_series(DashedLineSeries::new(
                        pts.iter().copied(),
                        8,
                        5,
                        line_style(l),
                    ))
                    .map_err(err)?;
            } else {
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), line_style(l)))
                    .map_err(err)?;
            }
        }
        for &p in pts {
            draw_marker(chart.plotting_area(), p, l)?;
        }
    }

    // The legend: two columns under the chart.
    let cols = 2usize;
    let colw = (w as i32 - 40) / cols as i32;
    for (i, l) in lines.iter().enumerate() {
        let (c, r) = ((i % cols) as i32, (i / cols) as i32);
        let x0 = 30 + c * colw;
        let y0 = 12 + r * 22;
        let sample = vec![(x0, y0), (x0 + 36, y0)];
        if l.joined {
            if l.dashed {
                legend_area
                    .draw(&DashedPathElement::new(sample, 8, 5, line_style(l)))
                    .map_err(err)?;
            } else {
                legend_area
                    .draw(&PathElement::new(sample, line_style(l)))
                    .map_err(err)?;
            }
        }
        draw_marker(&legend_area, (x0 + 18, y0), l)?;
        legend_area
            .draw(&Text::new(
                l.label.clone(),
                (x0 + 46, y0),
                TextStyle::from(("sans-serif", 14).into_font())
                    .pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(err)?;
    }
    Ok(())
}

/// Renders the plot as SVG text. `subtitle` goes under the title (e.g. the machine and the
/// number of repetitions).
pub fn render_svg(d: &Dataset, subtitle: &str) -> Result<String, String> {
    let bw = bandwidth_lines(d);
    let lat = latency_lines(d);
    let x = x_range(&[&bw, &lat]);
    let rows = bw.len().max(lat.len()).div_ceil(2) as u32;
    let legend_h = rows * 22 + 24;
    let (w, h) = (1400u32, 560 + legend_h + 60);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (head, body) = root.split_vertically(60);
        head.draw(&Text::new(
            "softrdma and its peers: medians against message size",
            (w as i32 / 2, 20),
            TextStyle::from(("sans-serif", 22).into_font())
                .pos(Pos::new(HPos::Center, VPos::Center)),
        ))
        .map_err(err)?;
        head.draw(&Text::new(
            subtitle.to_string(),
            (w as i32 / 2, 46),
            TextStyle::from(("sans-serif", 13).into_font())
                .color(&RGBColor(90, 90, 90))
                .pos(Pos::new(HPos::Center, VPos::Center)),
        ))
        .map_err(err)?;
        let (left, right) = body.split_horizontally(w / 2);
        panel(&left, "Bandwidth", "GB/s (log)", &bw, x, legend_h)?;
        panel(
            &right,
            "One-way latency, p50",
            "µs (log)",
            &lat,
            x,
            legend_h,
        )?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_labels() {
        let (b, l) = log_ticks(0.3, 30.0);
        assert_eq!(b, [0.5, 1.0, 2.0, 5.0, 10.0, 20.0]);
        assert!(l.contains(&3.0) && l.contains(&0.3) && !l.contains(&40.0));
        assert_eq!(y_label(0.05), "0.05");
        assert_eq!(y_label(20.0), "20");
    }

    #[test]
    fn y_ranges_end_on_ticks() {
        assert_eq!(snap(3.7, false), 2.0);
        assert_eq!(snap(3.7, true), 5.0);
        assert_eq!(snap(0.0021, false), 0.002);
        assert!((snap(0.0021, true) - 0.005).abs() < 1e-12);
        assert_eq!(snap(48.0, true), 50.0);
        assert_eq!(snap(10.0, true), 10.0);
    }

    #[test]
    fn renders_without_data() {
        let d = Dataset::default();
        let svg = render_svg(&d, "nothing").unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("no data in the CSV"));
    }
}
