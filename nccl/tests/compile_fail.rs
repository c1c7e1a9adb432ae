//! What the type system refuses, shown by programs that must not compile (each file in `ui/`, with
//! the compiler's message next to it in a `.stderr` file). The messages list the element types, so
//! this test needs the features the workspace build turns on: `cargo test --workspace` runs it, or
//! `cargo test -p nccl-rs --features f16,f8 --test compile_fail`. Regenerate the messages after a
//! deliberate change with `TRYBUILD=overwrite` before that command.

#[test]
fn unsound_programs_do_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
