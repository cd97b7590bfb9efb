//! The readable form of a status report: one aligned row per IF, as
//! `kpctl status` and `kpctl watch` print it.

use super::protocol::{StatusReport, StatusRow};

/// The columns: header, whether right-aligned, and the cell of a row.
type Column = (&'static str, bool, fn(&StatusRow) -> String);

const COLUMNS: [Column; 15] = [
    ("IF", true, |r| r.if_id.to_string()),
    ("MODEL", false, |r| r.model.clone()),
    ("STATE", false, |r| r.state.to_string()),
    ("PID", true, |r| opt(r.pid, |p| p.to_string())),
    ("SHARE", true, |r| format!("{:.1}%", r.share_pct)),
    ("PIN", false, |r| if r.pinned { "pin" } else { "-" }.into()),
    ("SLO ms", true, |r| decimal(r.slo_ms)),
    // Mean batch run / the policy's target now.
    ("BATCH", true, |r| match (r.mean_batch_size, r.batch_size) {
        (Some(m), Some(t)) => format!("{m:.1}/{t}"),
        (None, Some(t)) => format!("-/{t}"),
        (Some(m), None) => format!("{m:.1}/-"),
        (None, None) => "-".into(),
    }),
    ("REQ/s", true, |r| {
        opt(r.throughput_rps, |x| format!("{x:.1}"))
    }),
    ("ARRIVE/s", true, |r| {
        opt(r.arrival_rps, |x| format!("{x:.1}"))
    }),
    ("P50 ms", true, |r| opt(r.p50_ms, decimal)),
    ("P99 ms", true, |r| opt(r.p99_ms, decimal)),
    ("IN SLO", true, |r| {
        opt(r.slo_attainment, |a| format!("{:.1}%", a * 100.0))
    }),
    ("SWITCHES", true, |r| r.switchovers.to_string()),
    ("GAP µs", true, |r| {
        opt(r.last_switchover_gap_us, |g| g.to_string())
    }),
];

fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// Milliseconds with the precision they deserve: 0.42, 4.6, 200.
fn decimal(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 1.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.2}")
    }
}

/// `report` as an aligned table, one line per IF, with a header; a line
/// saying so when there are no IFs; a last line when shutting down. Every
/// line ends with a newline. Reasons of failed IFs follow the table.
pub fn format_status_table(report: &StatusReport) -> String {
    let mut out = String::new();
    if report.ifs.is_empty() {
        out.push_str("no inference functions deployed\n");
    } else {
        let cells: Vec<Vec<String>> = report
            .ifs
            .iter()
            .map(|row| COLUMNS.iter().map(|(_, _, cell)| cell(row)).collect())
            .collect();
        let widths: Vec<usize> = COLUMNS
            .iter()
            .enumerate()
            .map(|(i, (head, _, _))| {
                cells
                    .iter()
                    .map(|row| row[i].chars().count())
                    .chain([head.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let header: Vec<String> = COLUMNS.iter().map(|(h, _, _)| h.to_string()).collect();
        for line in std::iter::once(&header).chain(&cells) {
            let mut text = String::new();
            for (i, cell) in line.iter().enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                let pad = " ".repeat(widths[i] - cell.chars().count());
                if COLUMNS[i].1 {
                    text.push_str(&pad);
                    text.push_str(cell);
                } else {
                    text.push_str(cell);
                    text.push_str(&pad);
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        for row in &report.ifs {
            if let Some(reason) = &row.reason {
                out.push_str(&format!("if{} {}: {reason}\n", row.if_id, row.state));
            }
        }
    }
    if report.shutting_down {
        out.push_str("the orchestrator is shutting down\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::protocol::IfState;
    use super::*;

    fn row(if_id: u16, model: &str) -> StatusRow {
        StatusRow {
            if_id,
            model: model.into(),
            state: IfState::Active,
            pid: Some(4242),
            share_pct: 30.0,
            pinned: false,
            slo_ms: 20.0,
            batch_size: Some(8),
            mean_batch_size: Some(6.42),
            throughput_rps: Some(812.25),
            arrival_rps: Some(815.0),
            p50_ms: Some(4.61),
            p99_ms: Some(17.9),
            slo_attainment: Some(0.9912),
            switchovers: 2,
            last_switchover_gap_us: Some(850),
            reason: None,
        }
    }

    #[test]
    fn aligned_table() {
        let mut failed = row(12, "inception_v1");
        failed.state = IfState::Failed;
        failed.pid = None;
        failed.pinned = true;
        failed.p50_ms = None;
        failed.p99_ms = None;
        failed.slo_attainment = None;
        failed.throughput_rps = None;
        failed.reason = Some("exited with status 1".into());
        let report = StatusReport {
            platform: None,
            shutting_down: false,
            ifs: vec![row(1, "squeezenet"), failed],
        };
        let text = format_status_table(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("IF  MODEL         STATE"), "{text}");
        assert!(lines[1].contains("squeezenet"), "{text}");
        assert!(lines[1].contains("99.1%"), "{text}");
        assert!(lines[1].contains("812.2"), "{text}");
        assert!(lines[1].contains("6.4/8"), "mean batch / target: {text}");
        assert!(lines[2].contains("failed"), "{text}");
        assert!(lines[2].contains("pin"), "{text}");
        assert_eq!(lines[3], "if12 failed: exited with status 1");
        // Columns line up: every "STATE" cell starts where the header's does.
        let at = lines[0].find("STATE").unwrap();
        assert_eq!(&lines[1][at..at + 6], "active");
        assert_eq!(&lines[2][at..at + 6], "failed");
    }

    #[test]
    fn empty_and_shutting_down() {
        let report = StatusReport {
            platform: None,
            shutting_down: true,
            ifs: vec![],
        };
        assert_eq!(
            format_status_table(&report),
            "no inference functions deployed\nthe orchestrator is shutting down\n"
        );
    }
}
