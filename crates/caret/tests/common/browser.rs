//! A headless Chromium driven over WebDriver, for the page tests.

#![allow(dead_code)] // each test file uses its own share of it

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A script answering the ghost text Monaco shows (the page tests).
pub const GHOST: &str = "return [...new Set([...document.querySelectorAll('.view-lines [class*=ghost-text]')].map((e) => e.textContent))].join('').replace(/\\u00a0/g, ' ')";

/// A headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`).
pub struct Browser {
    driver: Child,
    url: String,
    session: String,
    http: reqwest::blocking::Client,
}

impl Browser {
    pub fn start() -> Browser {
        let chromedriver = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("the dashboard test needs Debian's chromium and chromium-driver (.ci/run installs them)");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        while http.get(format!("{url}/status")).send().map(|r| !r.status().is_success()).unwrap_or(true) {
            assert!(Instant::now() < until, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"]
            }
        }}});
        let created: Value = http.post(format!("{url}/session")).json(&caps).send().unwrap().json().unwrap();
        let session =
            created["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {created}")).to_owned();
        Browser { driver, url, session, http }
    }

    pub fn open(&self, page: &str) {
        let r = self.http.post(format!("{}/session/{}/url", self.url, self.session)).json(&json!({"url": page})).send();
        assert!(r.unwrap().status().is_success());
    }

    /// Runs `script` in the page and answers its value.
    pub fn eval(&self, script: &str) -> Value {
        let r: Value = self
            .http
            .post(format!("{}/session/{}/execute/sync", self.url, self.session))
            .json(&json!({"script": script, "args": []}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        r["value"].clone()
    }
}

impl Browser {
    /// Saves what the page looks like now (PNG). The driver may time out capturing a page
    /// still painting on a busy machine: tried three times, a second apart, then the
    /// driver's error is the failure.
    pub fn screenshot(&self, to: &Path) {
        use base64::Engine as _;
        let mut last = Value::Null;
        for _ in 0..3 {
            let r: Value = self
                .http
                .get(format!("{}/session/{}/screenshot", self.url, self.session))
                .send()
                .unwrap()
                .json()
                .unwrap();
            if let Some(b64) = r["value"].as_str() {
                let png = base64::engine::general_purpose::STANDARD.decode(b64).unwrap();
                std::fs::write(to, png).unwrap();
                return;
            }
            last = r;
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        panic!("the driver took no screenshot: {last}");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.http.delete(format!("{}/session/{}", self.url, self.session)).send();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// Puts `text` into the input or text area `selector` as if typed at once: focused, the
    /// caret at its end, and an `input` event fired.
    pub fn fill(&self, selector: &str, text: &str) {
        self.eval_async(
            "const [sel, text, done] = arguments; const i = document.querySelector(sel); i.focus(); i.value = text; \
             i.selectionStart = i.value.length; i.dispatchEvent(new Event('input')); done(true);",
            json!([selector, text]),
        );
    }

    /// Types `keys` into the focused element as key presses (WebDriver's key codes for
    /// special keys: `\u{E004}` Tab, `\u{E009}` Control, `\u{E007}` Enter).
    pub fn keys(&self, keys: &str) {
        let mut actions = Vec::new();
        let mut held = Vec::new();
        for c in keys.chars() {
            let k = c.to_string();
            if c == '\u{E009}' {
                actions.push(json!({"type": "keyDown", "value": k}));
                held.push(k);
                continue;
            }
            actions.push(json!({"type": "keyDown", "value": k}));
            actions.push(json!({"type": "keyUp", "value": k}));
        }
        for k in held.into_iter().rev() {
            actions.push(json!({"type": "keyUp", "value": k}));
        }
        let body = json!({"actions": [{"type": "key", "id": "keyboard", "actions": actions}]});
        let r = self.http.post(format!("{}/session/{}/actions", self.url, self.session)).json(&body).send().unwrap();
        assert!(r.status().is_success(), "{}", r.text().unwrap_or_default());
    }

    /// Runs `script` as an asynchronous script (it ends by calling its last argument) and
    /// answers the value it was called with; `args` are its first arguments.
    pub fn eval_async(&self, script: &str, args: Value) -> Value {
        let r: Value = self
            .http
            .post(format!("{}/session/{}/execute/async", self.url, self.session))
            .json(&json!({"script": script, "args": args}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        r["value"].clone()
    }

    /// Makes the frame `css` selects (in the current one) the one scripts and keys go to.
    pub fn enter_frame(&self, css: &str) {
        let found: Value = self
            .http
            .post(format!("{}/session/{}/element", self.url, self.session))
            .json(&json!({"using": "css selector", "value": css}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let element = found["value"].clone();
        assert!(element.is_object() && element.get("error").is_none(), "no frame {css}: {found}");
        let r =
            self.http.post(format!("{}/session/{}/frame", self.url, self.session)).json(&json!({"id": element})).send();
        assert!(r.unwrap().status().is_success(), "entering {css}");
    }

    /// Back to the top-level page.
    pub fn leave_frames(&self) {
        let r =
            self.http.post(format!("{}/session/{}/frame", self.url, self.session)).json(&json!({"id": null})).send();
        assert!(r.unwrap().status().is_success());
    }

    /// Waits until `script` returns something truthy (at most `secs` seconds) and returns it.
    pub fn wait_for(&self, what: &str, secs: u64, script: &str) -> Value {
        let until = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.eval(script);
            if !(v.is_null() || v == false || v == "" || v == 0) {
                return v;
            }
            assert!(
                Instant::now() < until,
                "waited {secs} s for {what}; the page: {}",
                self.eval("return document.body.innerText.slice(0, 2000)")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
