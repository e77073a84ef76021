//! The human status page served at `/`: a plain table of targets and their last cycles,
//! rendered from the `/api/v1/status` document. (Placeholder; the full page replaces this
//! file and keeps the signature of [`render`].)

use serde_json::Value;

/// Escapes text for HTML element content and attribute values.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => esc(s),
        other => esc(&other.to_string()),
    }
}

/// Renders the status page for a status document.
pub fn render(status: &Value) -> String {
    let mut html = String::from(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>lockprobe status</title></head><body>\n<h1>lockprobe status</h1>\n",
    );
    html.push_str(&format!(
        "<p>generated {} &middot; ready: {}</p>\n",
        text(&status["generatedAt"]),
        text(&status["ready"])
    ));
    let empty = Vec::new();
    for t in status["targets"].as_array().unwrap_or(&empty) {
        html.push_str(&format!("<h2>target {}</h2>\n", text(&t["name"])));
        html.push_str(&format!(
            "<p>last success {} &middot; missed schedules {} &middot; convergence declared {} s, expected {} s, observed {} s</p>\n",
            text(&t["lastSuccessAt"]),
            text(&t["missedSchedules"]),
            text(&t["convergence"]["declaredSeconds"]),
            text(&t["convergence"]["expectedSeconds"]),
            text(&t["convergence"]["observedSeconds"]),
        ));
        html.push_str("<table border=\"1\"><tr><th>started</th><th>finished</th><th>resource</th><th>result</th><th>failed assertions</th></tr>\n");
        for c in t["lastCycles"].as_array().unwrap_or(&empty) {
            html.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                text(&c["startedAt"]),
                text(&c["finishedAt"]),
                text(&c["resource"]),
                text(&c["result"]),
                text(&c["failedAssertions"]),
            ));
        }
        html.push_str("</table>\n");
    }
    html.push_str("</body></html>\n");
    html
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_targets_and_cycles_escaped() {
        let s = json!({"generatedAt": "now", "ready": true, "targets": [{
            "name": "demo<x>", "lastSuccessAt": null, "missedSchedules": 0,
            "convergence": {"declaredSeconds": 1.5, "expectedSeconds": null, "observedSeconds": 0.9},
            "lastCycles": [{"startedAt": "a", "finishedAt": "b", "resource": "probe-0001", "result": "passed", "failedAssertions": 0}]
        }]});
        let html = render(&s);
        assert!(html.contains("target demo&lt;x&gt;"), "{html}");
        assert!(
            html.contains("<td>probe-0001</td><td>passed</td>"),
            "{html}"
        );
    }
}
