// Every kind of bad input gives `file:line:col: error: ...`, a non-zero exit, and no
// Python traceback (test/python/test_ca_opt.py checks the exit status is exactly 1 and
// that no traceback is printed, for each of these inputs).

// RUN: not ca-opt %S/Inputs/does-not-exist.mlir 2>&1 | FileCheck %s --check-prefix=MISSING
// MISSING: does-not-exist.mlir:0:0: error: could not open input file: No such file or directory

// RUN: not ca-opt %S/Inputs/malformed.mlir 2>&1 | FileCheck %s --check-prefix=MALFORMED
// MALFORMED: malformed.mlir:3:12: error: expected ':'

// RUN: not ca-opt %S/Inputs/binary.mlir 2>&1 | FileCheck %s --check-prefix=BINARY
// BINARY: binary.mlir:0:0: error: input is not UTF-8 text

// RUN: not ca-opt %S/Inputs/unknown-ca-op.mlir 2>&1 | FileCheck %s --check-prefix=UNKNOWN-CA
// UNKNOWN-CA: unknown-ca-op.mlir:2:3: error: unknown operation 'ca.frobnicate' in dialect 'ca'

// RUN: not ca-opt %S/Inputs/unknown-dialect.mlir 2>&1 | FileCheck %s --check-prefix=UNKNOWN-DIALECT
// UNKNOWN-DIALECT: unknown-dialect.mlir:2:8: error: Dialect `foo' not found for custom op 'foo.bar'

// RUN: not ca-opt %S/Inputs/unregistered-generic.mlir 2>&1 | FileCheck %s --check-prefix=UNREGISTERED
// UNREGISTERED: unregistered-generic.mlir:2:3: error: unregistered operation 'foo.bar' (use --allow-unregistered-dialect to accept it)
// RUN: ca-opt %S/Inputs/unregistered-generic.mlir --allow-unregistered-dialect | FileCheck %s --check-prefix=ALLOWED
// ALLOWED: "foo.bar"(%arg0) : (i32) -> ()

// RUN: not ca-opt %S/Inputs/bad-hook-kind.mlir 2>&1 | FileCheck %s --check-prefix=VERIFIER
// VERIFIER: bad-hook-kind.mlir:2:8: error: 'ca.hook' op unknown hook kind 'sideways_hook'

// Unknown and misspelled passes, as flags and in a pipeline (the column points at the name).
// RUN: not ca-opt %S/Inputs/valid.mlir --ca-flaten-nodes 2>&1 | FileCheck %s --check-prefix=MISSPELLED-FLAG
// MISSPELLED-FLAG: <pass-pipeline>:1:1: error: 'ca-flaten-nodes' does not refer to a registered pass or pass pipeline; did you mean 'ca-flatten-nodes'?
// RUN: not ca-opt %S/Inputs/valid.mlir --pass-pipeline='builtin.module(cse,canonicalise)' 2>&1 | FileCheck %s --check-prefix=MISSPELLED-PIPELINE
// MISSPELLED-PIPELINE: <pass-pipeline>:1:20: error: 'canonicalise' does not refer to a registered pass or pass pipeline; did you mean 'canonicalize'?
// RUN: not ca-opt %S/Inputs/valid.mlir --no-such-pass-at-all 2>&1 | FileCheck %s --check-prefix=UNKNOWN-PASS
// UNKNOWN-PASS: error: 'no-such-pass-at-all' does not refer to a registered pass or pass pipeline (see ca-opt --list-passes)
// RUN: not ca-opt %S/Inputs/valid.mlir --pass-pipeline='builtin.module(cse' 2>&1 | FileCheck %s --check-prefix=UNBALANCED
// UNBALANCED: <pass-pipeline>:1:{{[0-9]+}}: error: missing ')' after the nested pipeline of 'builtin.module'

// Bad pass options, ours and upstream.
// RUN: not ca-opt %S/Inputs/valid.mlir --ca-flatten-nodes=keep-provenance=maybe 2>&1 | FileCheck %s --check-prefix=BAD-OPTION
// BAD-OPTION: error: pass 'ca-flatten-nodes': option 'keep-provenance' expects a bool, got 'maybe'
// RUN: not ca-opt %S/Inputs/valid.mlir --pass-pipeline='builtin.module(canonicalize{bogus=1})' 2>&1 | FileCheck %s --check-prefix=BAD-UPSTREAM-OPTION
// BAD-UPSTREAM-OPTION: <pass-pipeline>:1:16: error: invalid options for pass 'canonicalize'

// Our passes run on the module, not nested.
// RUN: not ca-opt %S/Inputs/valid.mlir --pass-pipeline='builtin.module(func.func(ca-flatten-nodes))' 2>&1 | FileCheck %s --check-prefix=NESTED
// NESTED: <pass-pipeline>:1:26: error: camlir pass 'ca-flatten-nodes' runs on the whole module

// Bad command lines.
// RUN: not ca-opt %S/Inputs/valid.mlir --pass-pipeline='builtin.module(cse)' --canonicalize 2>&1 | FileCheck %s --check-prefix=BOTH
// BOTH: ca-opt: error: give passes either as flags or as --pass-pipeline, not both
// RUN: not ca-opt %S/Inputs/valid.mlir -o 2>&1 | FileCheck %s --check-prefix=NO-VALUE
// NO-VALUE: ca-opt: error: argument -o: expected one argument
