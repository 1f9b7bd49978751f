//! `deltanet plot`: prefill time per token against the sequence length, from measurement files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use plotters::prelude::*;
use serde_json::Value;

use crate::{CmdResult, Failure};

/// Draw prefill time per token against T (both axes log scale) as an SVG.
///
/// Reads `deltanet bench --work prefill --json` files (a series per precision: "deltanet
/// exact", "deltanet fast") and `../shared/gpu/anchors.py --json` files (a series per
/// implementation: "fla", "flashqla"); each series is one line through its points, sorted by
/// T. Points of other shapes than the series' first (H, HV, K, V, or B) form series of their
/// own, named with the shape. Varlen measurements and other kinds of work are left out.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The SVG file to write.
    #[arg(long, value_name = "FILE.svg")]
    out: PathBuf,
    /// Title above the plot (default: the device of the first bench file).
    #[arg(long)]
    title: Option<String>,
    /// Measurement files (bench or anchors JSON).
    #[arg(required = true, value_name = "FILE.json")]
    files: Vec<PathBuf>,
}

/// One measured prefill: its shape and its median time.
#[derive(Clone, Debug)]
struct Point {
    label: String,
    shape: [u64; 5], // B, H, HV, K, V
    t: u64,
    ms: f64,
}

impl Point {
    fn ns_per_token(&self) -> f64 {
        self.ms * 1e6 / (self.shape[0] as f64 * self.t as f64)
    }

    /// The point where it can stand on the log axes: B and T of one or more, a positive finite
    /// time (plotters' log scale does not end on a zero or infinite range).
    fn checked(self, file: &Path) -> Result<Point, Failure> {
        let per_token = self.ns_per_token();
        if self.shape[0] == 0 || self.t == 0 || !(per_token > 0.0 && per_token.is_finite()) {
            return Err(Failure::data(format!(
                "{}: expected B >= 1, T >= 1 and a positive finite time, got B = {}, T = {}, {} ms",
                file.display(),
                self.shape[0],
                self.t,
                self.ms
            )));
        }
        Ok(self)
    }
}

fn field(v: &Value, key: &str, file: &Path) -> Result<u64, Failure> {
    v.get(key).and_then(Value::as_u64).ok_or_else(|| {
        Failure::data(format!(
            "{}: expected an integer \"{key}\" in {v}",
            file.display()
        ))
    })
}

/// The prefill points of one file, and its device if it names one.
fn read_points(file: &Path) -> Result<(Vec<Point>, Option<String>), Failure> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Failure::data(format!("{}: cannot read: {e}", file.display())))?;
    let doc: Value = serde_json::from_str(&text)
        .map_err(|e| Failure::data(format!("{}: not JSON: {e}", file.display())))?;
    let mut points = Vec::new();
    match &doc {
        // deltanet bench: one shape, a list of results.
        Value::Object(o) if o.contains_key("results") => {
            let shape = o
                .get("shape")
                .ok_or_else(|| Failure::data(format!("{}: no \"shape\"", file.display())))?;
            if !o.get("varlen").is_none_or(Value::is_null) {
                return Ok((points, None));
            }
            let dims = [
                field(shape, "B", file)?,
                field(shape, "H", file)?,
                field(shape, "HV", file)?,
                field(shape, "K", file)?,
                field(shape, "V", file)?,
            ];
            let t = field(shape, "T", file)?;
            let precision = o
                .get("precision")
                .and_then(Value::as_str)
                .unwrap_or("exact");
            for r in o["results"].as_array().into_iter().flatten() {
                if r.get("work").and_then(Value::as_str) != Some("prefill") {
                    continue;
                }
                let ms = r.get("median_ms").and_then(Value::as_f64).ok_or_else(|| {
                    Failure::data(format!("{}: a result without median_ms", file.display()))
                })?;
                points.push(
                    Point {
                        label: format!("deltanet {precision}"),
                        shape: dims,
                        t,
                        ms,
                    }
                    .checked(file)?,
                );
            }
            let device = o.get("device").and_then(Value::as_str).map(str::to_string);
            Ok((points, device))
        }
        // anchors.py: a list of rows, one per shape and kind of work.
        Value::Array(rows) => {
            for r in rows {
                if r.get("work").and_then(Value::as_str) != Some("prefill") {
                    continue;
                }
                let impl_ = r.get("impl").and_then(Value::as_str).unwrap_or("anchor");
                let ms = r.get("ms").and_then(Value::as_f64).ok_or_else(|| {
                    Failure::data(format!("{}: a row without \"ms\": {r}", file.display()))
                })?;
                points.push(
                    Point {
                        label: impl_.to_string(),
                        shape: [
                            field(r, "B", file)?,
                            field(r, "H", file)?,
                            field(r, "HV", file)?,
                            field(r, "K", file)?,
                            field(r, "V", file)?,
                        ],
                        t: field(r, "T", file)?,
                        ms,
                    }
                    .checked(file)?,
                );
            }
            Ok((points, None))
        }
        _ => Err(Failure::data(format!(
            "{}: expected a deltanet bench JSON object or an anchors.py JSON list",
            file.display()
        ))),
    }
}

/// The points grouped into named series (a shape other than the first one seen gets a series
/// of its own), each sorted by T.
fn series(points: &[Point]) -> BTreeMap<String, Vec<(f64, f64)>> {
    let first = points.first().map(|p| p.shape);
    let mut out: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for p in points {
        let name = if Some(p.shape) == first {
            p.label.clone()
        } else {
            let [b, h, hv, k, v] = p.shape;
            format!("{} (B={b} H={h} HV={hv} K={k} V={v})", p.label)
        };
        out.entry(name)
            .or_default()
            .push((p.t as f64, p.ns_per_token()));
    }
    for s in out.values_mut() {
        s.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

fn draw(
    svg: &mut String,
    title: &str,
    series: &BTreeMap<String, Vec<(f64, f64)>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let all = series.values().flatten();
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    // Some room around the points on the log axes.
    let (x0, x1, y0, y1) = (x0 / 1.5, x1 * 1.5, y0 / 2.0, y1 * 2.0);
    let root = SVGBackend::with_string(svg, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("T (tokens per sequence)")
        .y_desc("prefill time per token (ns)")
        .x_label_formatter(&|x| {
            if *x >= 1024.0 {
                format!("{:.0}K", x / 1024.0)
            } else {
                format!("{x:.0}")
            }
        })
        .y_label_formatter(&|y| match *y {
            y if y >= 100.0 => format!("{y:.0}"),
            y if y >= 1.0 => format!("{y:.1}"),
            y => format!("{y:.3}"),
        })
        .draw()?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

pub fn main(a: Args) -> CmdResult {
    if a.out.extension().is_none_or(|e| e != "svg") {
        return Err(Failure::usage(format!(
            "--out: expected a file name ending in .svg, got {}",
            a.out.display()
        )));
    }
    let mut points = Vec::new();
    let mut device = None;
    for f in &a.files {
        let (p, d) = read_points(f)?;
        points.extend(p);
        device = device.or(d);
    }
    if points.is_empty() {
        return Err(Failure::data(
            "no prefill measurements in the files (varlen and other work are left out)",
        ));
    }
    let series = series(&points);
    let title = a.title.unwrap_or_else(|| match device {
        Some(d) => format!("Gated DeltaNet prefill on {d}"),
        None => "Gated DeltaNet prefill".to_string(),
    });
    let mut svg = String::new();
    draw(&mut svg, &title, &series).map_err(|e| Failure::data(format!("drawing: {e}")))?;
    crate::lifecycle::write_output(&a.out, |mut out| {
        use std::io::Write;
        out.file()?
            .write_all(svg.as_bytes())
            .map_err(|e| deltanet::Error::file(&a.out, format!("cannot write: {e}")))?;
        out.commit()
    })?;
    for (name, pts) in &series {
        println!(
            "{name}: {} point{}",
            pts.len(),
            if pts.len() == 1 { "" } else { "s" }
        );
    }
    println!("wrote {}", a.out.display());
    Ok(ExitCode::SUCCESS)
}
