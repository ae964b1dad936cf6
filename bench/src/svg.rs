//! A small, dependency-free SVG bar-chart writer.
//!
//! Metrics with different units do not share an axis, so a [`Chart`] is a row of panels (small
//! multiples): each [`Panel`] is one metric with its own scale, one bar per runtime, the value
//! printed above each bar. A missing value is drawn as an empty slot labelled `n/a`.

use std::{fmt::Write as _, io, path::Path};

use crate::{fmt_num, Better};

/// One metric: a bar per runtime on its own scale.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Title above the panel, e.g. `spawn+join`.
    pub title: String,
    /// Unit under the title, e.g. `M tasks/s`.
    pub unit: String,
    /// Which direction is good, printed under the unit.
    pub better: Better,
    /// `(runtime, value)`; `None` when the runtime has no result.
    pub bars: Vec<(String, Option<f64>)>,
}

/// A titled row of [`Panel`]s.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Title at the top of the image.
    pub title: String,
    /// Smaller text under the title (machine, date, mode).
    pub subtitle: String,
    /// The panels, left to right, wrapping after [`Chart::PER_ROW`].
    pub panels: Vec<Panel>,
}

/// Bar colours, one per runtime position; the first (xtc) stands out.
const COLOURS: [&str; 8] = [
    "#d62728", "#7f7f7f", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf",
];

const PANEL_W: f64 = 300.0;
const PANEL_H: f64 = 260.0;
const TOP: f64 = 60.0;

impl Chart {
    /// Panels per row before wrapping.
    pub const PER_ROW: usize = 3;

    /// Renders the chart as a standalone SVG document.
    pub fn render(&self) -> String {
        let n = self.panels.len().max(1);
        let cols = n.min(Self::PER_ROW);
        let rows = n.div_ceil(Self::PER_ROW);
        let width = PANEL_W * cols as f64 + 20.0;
        let height = TOP + PANEL_H * rows as f64 + 10.0;
        let mut s = open(width, height, &self.title, &self.subtitle);
        for (i, panel) in self.panels.iter().enumerate() {
            let x0 = 10.0 + PANEL_W * (i % Self::PER_ROW) as f64;
            let y0 = TOP + PANEL_H * (i / Self::PER_ROW) as f64;
            render_panel(&mut s, panel, x0, y0);
        }
        s.push_str("</svg>\n");
        s
    }

    /// Writes the chart to `path` and says where on stdout (or why not on stderr, as binary
    /// `bin`); the exit code a benchmark binary ends with.
    pub fn write_and_report(&self, bin: &str, path: &Path) -> std::process::ExitCode {
        report_written(bin, path, self.write(path))
    }

    /// Writes [`Chart::render`] to `path`, creating its parent directory if needed.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        write_file(path, &self.render())
    }
}

/// Starts an SVG document of `width` x `height` pixels: a white background, `title` in bold at
/// the top left and `subtitle` under it. The caller appends the drawing and `</svg>`.
pub(crate) fn open(width: f64, height: f64, title: &str, subtitle: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="10" y="24" font-size="18" font-weight="bold">{}</text>"#,
        esc(title)
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="44" font-size="12" fill="#555">{}</text>"##,
        esc(subtitle)
    );
    s
}

/// Says on stdout where a chart went (`written` is the outcome of writing it to `path`), or
/// why not on stderr, as binary `bin`; the exit code a benchmark binary ends with.
pub fn report_written(bin: &str, path: &Path, written: io::Result<()>) -> std::process::ExitCode {
    match written {
        Ok(()) => {
            let shown = std::fs::canonicalize(path).unwrap_or(path.to_path_buf());
            println!("  chart written to {}", shown.display());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{bin}: could not write {}: {e}", path.display());
            std::process::ExitCode::FAILURE
        }
    }
}

/// Writes a document (an SVG, or any text) to `path`, creating its parent directory if needed.
/// Cost: one directory creation at most and one file write.
pub fn write_file(path: &Path, svg: &str) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, svg)
}

fn render_panel(s: &mut String, p: &Panel, x0: f64, y0: f64) {
    let plot_top = y0 + 50.0;
    let plot_h = PANEL_H - 100.0;
    let base_y = plot_top + plot_h;
    let inner_w = PANEL_W - 30.0;
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-size="14" font-weight="bold">{}</text>"#,
        x0,
        y0 + 16.0,
        esc(&p.title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" font-size="11" fill="#555">{} ({} is better)</text>"##,
        x0,
        y0 + 32.0,
        esc(&p.unit),
        p.better.word()
    );
    let max = p
        .bars
        .iter()
        .filter_map(|(_, v)| *v)
        .fold(0.0_f64, f64::max);
    let slots = p.bars.len().max(1) as f64;
    let slot_w = inner_w / slots;
    let bar_w = slot_w * 0.7;
    let _ = writeln!(
        s,
        r##"<line x1="{x0:.1}" y1="{base_y:.1}" x2="{:.1}" y2="{base_y:.1}" stroke="#333"/>"##,
        x0 + inner_w
    );
    for (j, (label, value)) in p.bars.iter().enumerate() {
        let bx = x0 + slot_w * j as f64 + (slot_w - bar_w) / 2.0;
        let cx = bx + bar_w / 2.0;
        let colour = COLOURS[j % COLOURS.len()];
        match value {
            Some(v) => {
                let h = if max > 0.0 {
                    (v / max).max(0.0) * plot_h
                } else {
                    0.0
                };
                let _ = writeln!(
                    s,
                    r#"<rect x="{bx:.1}" y="{:.1}" width="{bar_w:.1}" height="{h:.1}" fill="{colour}"><title>{}: {} {}</title></rect>"#,
                    base_y - h,
                    esc(label),
                    fmt_num(*v),
                    esc(&p.unit)
                );
                let _ = writeln!(
                    s,
                    r#"<text x="{cx:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
                    base_y - h - 4.0,
                    fmt_num(*v)
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    r##"<text x="{cx:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#999">n/a</text>"##,
                    base_y - 4.0
                );
            }
        }
        let _ = writeln!(
            s,
            r#"<text x="{cx:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"#,
            base_y + 16.0,
            esc(label)
        );
    }
}

/// Escapes text for SVG element content.
/// `t` with the characters SVG text cannot hold as they are (`&`, `<`, `>`) escaped.
pub(crate) fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_bars_and_missing_values() {
        let chart = Chart {
            title: "local <bench>".into(),
            subtitle: "quick".into(),
            panels: vec![Panel {
                title: "spawn".into(),
                unit: "M tasks/s".into(),
                better: Better::Higher,
                bars: vec![("xtc".into(), Some(2.0)), ("tokio".into(), None)],
            }],
        };
        let svg = chart.render();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("local &lt;bench&gt;"));
        assert!(svg.contains(">n/a<"));
        assert_eq!(svg.matches("<rect x=").count(), 1);
    }
}
