//! What the type system refuses, shown by programs that must not compile (each file in `ui/`, with
//! the compiler's message next to it in a `.stderr` file): `cargo test -p gpucomm-kernels --test
//! compile_fail`. Regenerate the messages after a deliberate change with `TRYBUILD=overwrite`
//! before that command.

#[test]
fn unsound_programs_do_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
