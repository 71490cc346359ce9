//! `caret admin usage`: the usage telemetry's hourly files, summed; tenants by name.

use anyhow::Context as _;

/// A tenant's id by its name.
pub(crate) async fn tenant_id(db: &caret_index::Db, name: Option<&str>) -> anyhow::Result<Option<String>> {
    let Some(name) = name else { return Ok(None) };
    let t = db.tenant_by_name(name).await?.with_context(|| format!("no tenant named {name}"))?;
    Ok(Some(t.id))
}

/// `caret admin usage`: the usage files' figures, per tenant (by name), event and label.
pub(crate) async fn report(
    service: &caret_index::service::Service,
    tenant: Option<&str>,
    since: &str,
    json: bool,
) -> anyhow::Result<()> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
    let since_hour = caret_usage::parse_since(since, now).map_err(anyhow::Error::msg)?;
    let tenant_id = tenant_id(service.db(), tenant).await?;
    let read = caret_usage::read(service.store().as_ref(), tenant_id.as_deref(), since_hour).await?;
    let names: std::collections::HashMap<String, String> =
        service.db().tenants().await?.into_iter().map(|t| (t.id, t.name)).collect();
    let name_of = |id: &str| names.get(id).cloned().unwrap_or_else(|| id.to_owned());
    let summary = caret_usage::summarise(&read.rows, false);
    // Tab suggestions and next edits accepted of those shown, per tenant.
    let acceptance = |kind: &str| {
        let mut by: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for s in &summary {
            let e = by.entry(name_of(&s.tenant)).or_default();
            match s.event.strip_prefix(kind) {
                Some(".shown") => e.0 += s.count,
                Some(".accepted") => e.1 += s.count,
                _ => {}
            }
        }
        by.retain(|_, (shown, _)| *shown > 0);
        by
    };
    let (tab, next_edit) = (acceptance("tab"), acceptance("next_edit"));
    for why in &read.skipped {
        eprintln!("skipped: {why}");
    }
    if json {
        let rows: Vec<serde_json::Value> = summary
            .iter()
            .map(|s| {
                let mut v = serde_json::to_value(s).unwrap_or_default();
                v["tenant"] = serde_json::Value::String(name_of(&s.tenant));
                v
            })
            .collect();
        let rates =
            |by: &std::collections::BTreeMap<String, (u64, u64)>| -> serde_json::Map<String, serde_json::Value> {
                by.iter()
                    .map(|(t, (shown, accepted))| {
                        let rate = *accepted as f64 / *shown as f64;
                        (t.clone(), serde_json::json!({"shown": shown, "accepted": accepted, "rate": rate}))
                    })
                    .collect()
            };
        let out = serde_json::json!({
            "since": caret_usage::hour_name(since_hour),
            "files": read.files,
            "skipped": read.skipped,
            "rows": rows,
            "tab_acceptance": rates(&tab),
            "next_edit_acceptance": rates(&next_edit),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    if summary.is_empty() {
        println!(
            "no usage since {} UTC ({} files): is `[usage] collect` on (CARET_USAGE_COLLECT=on)?",
            caret_usage::hour_name(since_hour),
            read.files
        );
        return Ok(());
    }
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0}"));
    println!("since {} UTC, from {} files", caret_usage::hour_name(since_hour), read.files);
    println!(
        "{:<16} {:<13} {:<16} {:>9} {:>7} {:>8} {:>8}",
        "tenant", "event", "label", "count", "failed", "p50 ms", "p95 ms"
    );
    for s in &summary {
        println!(
            "{:<16} {:<13} {:<16} {:>9} {:>7} {:>8} {:>8}",
            name_of(&s.tenant),
            s.event,
            s.label,
            s.count,
            s.failed,
            ms(s.p50_ms),
            ms(s.p95_ms)
        );
    }
    for (what, by) in [("Tab suggestions", &tab), ("next edits", &next_edit)] {
        for (t, (shown, accepted)) in by {
            println!(
                "{t}: {what} accepted {accepted} of {shown} shown ({:.1}%)",
                *accepted as f64 * 100.0 / *shown as f64
            );
        }
    }
    Ok(())
}
