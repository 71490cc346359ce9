#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let target = caret_fuzz::target("edit_formats").map(|t| t.run);
    if let Some(run) = target {
        run(data);
    }
});
