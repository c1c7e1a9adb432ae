//! SVG plots of bus bandwidth against message size (plotters, SVG backend only: no font or
//! system library is needed; text is left to the SVG viewer).

use std::path::Path;

use plotters::prelude::*;

use super::results::Run;
use crate::error::{CliError, Result};
use crate::units::human_bytes;

/// One named curve: `(size in bytes, value)` points.
pub struct Curve {
    /// Legend text.
    pub label: String,
    /// Points, sizes > 0.
    pub points: Vec<(f64, f64)>,
}

/// Fails early (before a long run) when `path` cannot be written.
pub fn check_writable(path: &Path) -> Result<()> {
    let bad = |why: String| CliError::WriteOutput { what: "plot", path: path.to_path_buf(), why };
    if path.is_dir() {
        return Err(bad("it is a directory".into()));
    }
    let existed = path.exists();
    std::fs::OpenOptions::new().append(true).create(true).open(path).map_err(|e| bad(e.to_string()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Bus bandwidth of one run, out-of-place and in-place.
pub fn draw_run(path: &Path, run: &Run) -> Result<()> {
    let curve = |label: &str, pick: fn(&super::results::Row) -> Option<f64>| Curve {
        label: format!("{} {label}", run.tool),
        points: run.rows.iter().filter(|r| r.size > 0).filter_map(|r| Some((r.size as f64, pick(r)?))).collect(),
    };
    let curves: Vec<Curve> = [
        curve("out-of-place", |r| r.out_of_place.as_ref().map(|m| m.busbw)),
        curve("in-place", |r| r.in_place.as_ref().map(|m| m.busbw)),
    ]
    .into_iter()
    .filter(|c| !c.points.is_empty())
    .collect();
    let title = format!(
        "{} bus bandwidth, {} ranks, NCCL {}",
        run.collective,
        run.nranks.map_or("?".to_string(), |n| n.to_string()),
        run.nccl_version.as_deref().unwrap_or("?")
    );
    draw(path, &title, &curves, None)
}

/// Draws `curves` (bus bandwidth, GB/s) against size on a log axis; with `ratio`, a second panel
/// below shows it around 1.
pub fn draw(path: &Path, title: &str, curves: &[Curve], ratio: Option<&Curve>) -> Result<()> {
    let fail = |e: String| CliError::WriteOutput { what: "plot", path: path.to_path_buf(), why: e };
    let all: Vec<(f64, f64)> = curves.iter().flat_map(|c| c.points.iter().copied()).collect();
    if all.is_empty() {
        return Err(fail("no sizes above 0 bytes to plot".into()));
    }
    let x_min = all.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x_max = all.iter().map(|p| p.0).fold(0.0, f64::max).max(x_min * 2.0);
    let y_max = all.iter().map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.1;
    let root = SVGBackend::new(path, (1000, if ratio.is_some() { 760 } else { 560 })).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let (top, bottom) = match ratio {
        Some(_) => {
            let (t, b) = root.split_vertically(520);
            (t, Some(b))
        }
        None => (root.clone(), None),
    };
    let x_label = |v: &f64| human_bytes(v.round() as u64);
    let mut chart = ChartBuilder::on(&top)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x_min..x_max).log_scale(), 0.0..y_max)
        .map_err(|e| fail(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc("bus bandwidth (GB/s)")
        .x_label_formatter(&x_label)
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    for (i, c) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(c.points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| fail(e.to_string()))?
            .label(c.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(c.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| fail(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    if let (Some(area), Some(r)) = (bottom, ratio) {
        let lo = r.points.iter().map(|p| p.1).fold(1.0, f64::min).min(0.9);
        let hi = r.points.iter().map(|p| p.1).fold(1.0, f64::max).max(1.1);
        let mut rc = ChartBuilder::on(&area)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((x_min..x_max).log_scale(), lo..hi)
            .map_err(|e| fail(e.to_string()))?;
        rc.configure_mesh()
            .x_desc("message size")
            .y_desc(r.label.as_str())
            .x_label_formatter(&x_label)
            .draw()
            .map_err(|e| fail(e.to_string()))?;
        rc.draw_series(LineSeries::new([(x_min, 1.0), (x_max, 1.0)], BLACK.mix(0.4)))
            .map_err(|e| fail(e.to_string()))?;
        rc.draw_series(LineSeries::new(r.points.iter().copied(), RED.stroke_width(2)))
            .map_err(|e| fail(e.to_string()))?;
        rc.draw_series(r.points.iter().map(|&p| Circle::new(p, 3, RED.filled()))).map_err(|e| fail(e.to_string()))?;
    }
    root.present().map_err(|e| fail(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_an_svg_with_both_panels() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("busbw.svg");
        let pts = |f: f64| (3..34).step_by(2).map(|e| (2f64.powi(e), f * e as f64)).collect::<Vec<_>>();
        let curves = [
            Curve { label: "gpucomm".into(), points: pts(10.0) },
            Curve { label: "nccl-tests".into(), points: pts(10.1) },
        ];
        let ratio =
            Curve { label: "busbw ratio Rust/C".into(), points: pts(10.0).iter().map(|p| (p.0, 0.99)).collect() };
        draw(&path, "all_reduce bus bandwidth", &curves, Some(&ratio)).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..60]);
        for text in
            ["all_reduce bus bandwidth", "gpucomm", "nccl-tests", "busbw ratio Rust/C", "MiB", "bus bandwidth (GB/s)"]
        {
            assert!(svg.contains(text), "{text} missing");
        }
    }

    #[test]
    fn unwritable_paths_are_refused_before_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_writable(dir.path()).unwrap_err();
        assert!(e.to_string().ends_with("it is a directory"), "{e}");
        let e = check_writable(&dir.path().join("missing/dir/plot.svg")).unwrap_err();
        assert!(e.to_string().starts_with("cannot write plot "), "{e}");
        assert_eq!(e.exit_code(), crate::error::EXIT_USAGE);
        let ok = dir.path().join("plot.svg");
        check_writable(&ok).unwrap();
        assert!(!ok.exists(), "the probe leaves no empty file behind");
        let e = draw(&ok, "t", &[], None).unwrap_err();
        assert!(e.to_string().ends_with("no sizes above 0 bytes to plot"));
    }
}
