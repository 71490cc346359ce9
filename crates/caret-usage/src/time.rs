//! Hours since the Unix epoch, and their names (`YYYY-MM-DDTHH`, UTC) in file keys.

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { yoe + era * 400 + 1 } else { yoe + era * 400 }, m, d)
}

/// The name of an hour since the epoch: `2026-11-26T15`.
pub fn hour_name(hour: i64) -> String {
    let (y, m, d) = civil_from_days(hour.div_euclid(24));
    format!("{y:04}-{m:02}-{d:02}T{:02}", hour.rem_euclid(24))
}

/// A Unix time in milliseconds as RFC 3339 in UTC: `2026-11-26T15:04:05.123Z`.
pub fn rfc3339(ms: i64) -> String {
    let (secs, milli) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{milli:03}Z", s / 3600, s / 60 % 60, s % 60)
}

/// The hour a name (`2026-11-26T15`, or a day `2026-11-26`: its first hour) stands for.
pub fn parse_hour(name: &str) -> Option<i64> {
    let (date, hour) = match name.split_once('T') {
        Some((date, hour)) => (date, hour.parse::<i64>().ok().filter(|h| (0..24).contains(h))?),
        None => (name, 0),
    };
    let mut parts = date.split('-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok().filter(|m| (1..=12).contains(m))?;
    let d: i64 = parts.next()?.parse().ok().filter(|d| (1..=31).contains(d))?;
    if parts.next().is_some() || date.len() != 10 {
        return None;
    }
    let days = days_from_civil(y, m, d);
    // 2026-02-31 is not a day.
    (civil_from_days(days) == (y, m, d)).then_some(days * 24 + hour)
}

/// The first hour `--since` names, `now_s` being the time now (Unix seconds): a span back
/// from now (`90m`, `24h`, `7d`) or an hour or day (`2026-11-26T15`, `2026-11-26`).
pub fn parse_since(since: &str, now_s: i64) -> Result<i64, String> {
    let s = since.trim();
    if let Some(hour) = parse_hour(s) {
        return Ok(hour);
    }
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let n: i64 = n.parse().map_err(|_| bad_since(since))?;
    let seconds = match unit {
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(bad_since(since)),
    };
    Ok((now_s - seconds).div_euclid(3600))
}

fn bad_since(since: &str) -> String {
    format!(
        "--since {since:?} is neither a span back from now (90m, 24h, 7d) nor an hour or day (2026-11-26T15, 2026-11-26)"
    )
}

/// The hour now.
pub(crate) fn now_hour() -> i64 {
    now_s().div_euclid(3600)
}

/// Unix seconds now.
pub(crate) fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_round_trip_through_their_names() {
        assert_eq!(hour_name(0), "1970-01-01T00");
        // 2026-11-26 15:00 UTC is 1_795_705_200 s.
        assert_eq!(hour_name(1_795_705_200 / 3600), "2026-11-26T15");
        for hour in [-100_000, -1, 0, 1, 470_000, 493_251, 1_000_000] {
            assert_eq!(parse_hour(&hour_name(hour)), Some(hour), "{}", hour_name(hour));
        }
        assert_eq!(parse_hour("2024-02-29"), Some(days_from_civil(2024, 2, 29) * 24));
        assert_eq!(rfc3339(1_764_169_445_123), "2025-11-26T15:04:05.123Z");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        for bad in ["2026-02-31", "2026-13-01", "2026-11-26T24", "2026-11-26T", "26-11-26", "yesterday", ""] {
            assert_eq!(parse_hour(bad), None, "{bad}");
        }
    }

    #[test]
    fn since_is_a_span_back_or_an_hour() {
        let now = 1_795_705_200 + 1800; // 15:30
        assert_eq!(parse_since("24h", now).map(hour_name), Ok("2026-11-25T15".to_owned()));
        assert_eq!(parse_since("7d", now).map(hour_name), Ok("2026-11-19T15".to_owned()));
        assert_eq!(parse_since("90m", now).map(hour_name), Ok("2026-11-26T14".to_owned()));
        assert_eq!(parse_since("2026-11-20", now).map(hour_name), Ok("2026-11-20T00".to_owned()));
        assert!(parse_since("a week", now).unwrap_err().contains("--since"));
        assert!(parse_since("7w", now).is_err());
    }
}
