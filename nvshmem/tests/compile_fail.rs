//! What the type system refuses, shown by programs that must not compile (each file in `ui/`, with
//! the compiler's message next to it in a `.stderr` file). Regenerate the messages after a
//! deliberate change with `TRYBUILD=overwrite cargo test -p nvshmem --test compile_fail`.

#[test]
fn unsound_programs_do_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
    // The compiler's message lists the element types, which the `f16` feature adds to.
    #[cfg(not(feature = "f16"))]
    cases.compile_fail("tests/ui/default-features/*.rs");
}
