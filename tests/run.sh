#!/bin/sh
# run.sh - the whole test suite (make test): dependencies, a -Werror build,
# every test program, the CLI tests, then the same under ASan+UBSan and
# under TSan, and a clang -Werror build.  Ends with "N passed, N failed".
# Two streams: gcc and ASan+UBSan in the foreground; TSan, clang, the
# short libFuzzer runs, then test_run_mpi.sh on the gcc build and the CLI's
# scripts on the ASan+UBSan build (built by the first stream, waited for)
# beside them on the second core (no test depends on another, none asserts
# a time; page-cache checks count their own file's pages), that stream's
# report printed after the first's.
set -u
cd "$(dirname "$0")/.." || exit 1
sh tools/deps.sh || { echo "0 passed, 1 failed"; exit 1; }
JOBS=$(nproc 2>/dev/null || echo 2)
LOG=$(mktemp -d "${TMPDIR:-/tmp}/engram-suite-XXXXXX")
# Every test's private directories (testutil.h's tu_dir, lib.sh's tmpdir,
# Python's tempfile) in one folder of the suite's: removed with it, also
# those of a test that died by abort() or a sanitizer's _exit(), which skip
# the tests' own clean-up (before, such directories stayed in /tmp).  Mode
# 1777 as /tmp's: a test that runs a command as another user (test_files.sh
# as nobody) opens its own directory to it, and the way there must be open.
TMP=$(mktemp -d "${TMPDIR:-/tmp}/engram-suite-tmp-XXXXXX") && chmod 1777 "$TMP" ||
    { rm -rf "$LOG"; echo "0 passed, 1 failed"; exit 1; }
trap 'rm -rf "$LOG" "$TMP"' EXIT
export TMPDIR="$TMP"
# Interrupted (Ctrl-C, or TERM), the whole suite ends: every process below
# this shell gets TERM (end_tree), the second stream and the test it is
# running included (a job put in the background by a non-interactive shell
# ignores SIGINT; `timeout` puts its command in a group of its own), and
# this shell exits through its EXIT trap once the second stream has ended.
# Only the suite's own processes: not make, nor what called it.  A TERM sent
# to this shell alone acts once its running command (a build, a test) ends.
end_tree() { # end_tree PID: PID and every process below it stopped top-down
    # (none can start another meanwhile), then sent TERM and continued
    kill -STOP "$1" 2>/dev/null || return 0
    for c in $(pgrep -P "$1"); do end_tree "$c"; done
    kill -TERM "$1" 2>/dev/null
    kill -CONT "$1" 2>/dev/null
}
interrupted() { # interrupted STATUS
    trap '' INT TERM
    for c in $(pgrep -P $$); do end_tree "$c"; done
    [ -n "${second_pid:-}" ] && wait "$second_pid" 2>/dev/null
    exit "$1"
}
trap 'interrupted 130' INT
trap 'interrupted 143' TERM
pass=0
fail=0
STREAM=1 # names this stream's scratch output file

run() { # run NAME COMMAND...
    name=$1; shift
    t0=$(date +%s.%N)
    if "$@" >"$LOG/out$STREAM" 2>&1; then
        pass=$((pass + 1)); status=PASS
    else
        fail=$((fail + 1)); status=FAIL
    fi
    t1=$(date +%s.%N)
    printf '%s %-40s %6.2fs\n' "$status" "$name" "$(echo "$t1 - $t0" | bc 2>/dev/null || echo 0)"
    [ "$status" = PASS ] || sed 's/^/    | /' "$LOG/out$STREAM" | tail -40
}

nonempty() { # nonempty DIR: DIR holds a file
    for f in "$1"/*; do [ -e "$f" ] && return 0; done
    return 1
}

build() { # build NAME MAKE-ARGS...
    name=$1; shift
    run "build: $name" make -j"$JOBS" WERROR=1 "$@" all
}

marked_build() { # marked_build MARK NAME MAKE-ARGS...: build, then MARK.built or
    # MARK.failed in $LOG for the second stream's wait (built MARK)
    mark=$1; shift
    if build "$@"; then : >"$LOG/$mark.built"; else : >"$LOG/$mark.failed"; return 1; fi
}

suite() { # suite PREFIX BUILD_DIR [SKIP...]: every test program but the skipped
    prefix=$1; dir=$2; shift 2
    for t in "$dir"/tests/test_*; do
        b=$(basename "$t")
        case " $* " in *" $b "*) continue ;; esac
        [ -x "$t" ] && run "$prefix$b" "$t"
    done
}

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1

# have_mpi: Open MPI's mpicc and mpirun are here (libengram-mpi is built
# where mpicc is found; deps.sh installs Open MPI)
have_mpi() {
    command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1
}

# built NAME: wait for the first stream's build NAME (it writes NAME.built
# or NAME.failed after the attempt; $$ is the suite's shell: its end ends
# the wait), then true if it was built
built() {
    while [ ! -e "$LOG/$1.built" ] && [ ! -e "$LOG/$1.failed" ] && kill -0 $$ 2>/dev/null; do
        sleep 5
    done
    [ -e "$LOG/$1.built" ]
}

second_stream() {
    pass=0
    fail=0
    STREAM=2
    build "tsan" SANITIZE=thread && {
        # test_blas checks bounds against OpenBLAS on the calling thread: nothing for TSan
        suite "tsan: " build-san-thread test_blas
        run "tsan: stress_sessions (16 threads, 3 s)" build-san-thread/tests/stress_sessions --threads 16 --seconds 3
        # the same load through the thread-pool engine (io_uring refused or
        # not used: containers' seccomp filters, buffered descriptors)
        run "tsan: stress_sessions, thread engine (16 threads, 3 s)" env ENGRAM_IO=threads \
            build-san-thread/tests/stress_sessions --threads 16 --seconds 3
        # libengram-mpi's test (not in `all` of sanitizer builds: named here)
        if have_mpi; then
            run "tsan: build test_mpi_combine, test_mpi_exchange" make -j"$JOBS" WERROR=1 SANITIZE=thread \
                build-san-thread/tests/mpi/test_mpi_combine build-san-thread/tests/mpi/test_mpi_exchange
            run "tsan: test_mpi.sh (mpirun -np 2)" sh tests/test_mpi.sh build-san-thread 2
        fi
    }
    if command -v clang >/dev/null 2>&1; then
        # clang: the compute kernels and parsers it compiles differently; the I/O
        # and threading tests (reader, sessions, faults, page cache) are
        # compiler-independent logic, run above under gcc, ASan and TSan.  No
        # nvcc (CUDA_KERNELS=0): it compiles the .cu files with its own host
        # compiler whatever CC is, as the gcc build did; the C side is clang's
        build "clang" CC=clang BUILD=build-clang CUDA_KERNELS=0 && suite "clang: " build-clang test_reader test_session \
            test_faults_reader test_faults_files test_faults_pools test_pagecache test_threads test_interleave
        # libFuzzer on the model reader and the tokenizer reader for a fixed
        # time; any crash fails.
        if run "build: libFuzzer targets" make -j"$JOBS" fuzz; then
            mkdir -p "$LOG/corpus" "$LOG/corpus_tokmap"
            run "libFuzzer: fuzz_model, ${FUZZ_SECONDS:-15} s" build-fuzz/fuzz_model \
                -max_total_time="${FUZZ_SECONDS:-15}" -print_final_stats=1 "$LOG/corpus" \
                tests/fuzz/corpus/model
            run "libFuzzer: fuzz_tokmap, ${FUZZ_SECONDS:-15} s" build-fuzz/fuzz_tokmap \
                -max_total_time="${FUZZ_SECONDS:-15}" -max_len=4096 -print_final_stats=1 \
                "$LOG/corpus_tokmap" tests/fuzz/tokmap_seeds
            mkdir -p "$LOG/corpus_cli" "$LOG/corpus_residual"
            run "libFuzzer: fuzz_cli, 8 s" build-fuzz/fuzz_cli -max_total_time=8 -max_len=4096 \
                -print_final_stats=1 "$LOG/corpus_cli" tests/fuzz/cli_seeds
            run "libFuzzer: fuzz_residual, 8 s" build-fuzz/fuzz_residual -max_total_time=8 \
                -max_len=4200 -print_final_stats=1 "$LOG/corpus_residual" tests/fuzz/residual_seeds
            mkdir -p "$LOG/corpus_ple"
            run "libFuzzer: fuzz_ple, 8 s" build-fuzz/fuzz_ple -max_total_time=8 \
                -max_len=4096 -print_final_stats=1 "$LOG/corpus_ple" tests/fuzz/ple_seeds
        fi
    fi
    # test_run_mpi.sh on the gcc build, here to even the streams' times,
    # then the CLI's scripts on the ASan+UBSan build: each once the first
    # stream has built it (built NAME, below)
    if have_mpi && built gcc; then
        run "test_run_mpi.sh (engram run --shard, TP and DP, -np 2 and 4)" sh tests/test_run_mpi.sh build
    fi
    if built asan; then
        A=build-san-address,undefined
        run "asan+ubsan: test_cli" sh tests/test_cli.sh $A
        run "asan+ubsan: test_apply.sh" sh tests/test_apply.sh $A
        run "asan+ubsan: test_ple_apply.sh" sh tests/test_ple_apply.sh $A
        run "asan+ubsan: test_ple_build.sh" sh tests/test_ple_build.sh $A
        run "asan+ubsan: test_ple_cli.sh" sh tests/test_ple_cli.sh $A
        run "asan+ubsan: test_shard_files.sh" sh tests/test_shard_files.sh $A
        run "asan+ubsan: test_run.sh" sh tests/test_run.sh $A
        run "asan+ubsan: test_ple_run.sh" sh tests/test_ple_run.sh $A
        run "asan+ubsan: test_files.sh" sh tests/test_files.sh $A
        run "asan+ubsan: test_inputs.sh" sh tests/test_inputs.sh $A
    fi
    echo "$pass $fail" >"$LOG/second.count"
}
second_stream >"$LOG/second.log" 2>&1 &
second_pid=$!

SEEDS="$LOG/seeds"
# (the second stream runs test_run_mpi.sh on this build: marked gcc)
marked_build gcc "gcc -O2" && {
    suite "" build
    run "test_cli" sh tests/test_cli.sh build
    run "test_install (make install, pkg-config, library split)" sh tests/test_install.sh build
    run "test_apply.sh (numpy float64 reference)" sh tests/test_apply.sh build
    run "test_ple_apply.sh (PLE output stage vs numpy float64)" sh tests/test_ple_apply.sh build
    run "test_ple_cli.sh (info, hash, rows on a PLE model)" sh tests/test_ple_cli.sh build
    run "test_shard_files.sh (engram shard: files, rows, --check, all-or-nothing)" sh tests/test_shard_files.sh build
    run "test_ple_build.sh (qwen4exp build vs @huggingface/gguf)" sh tests/test_ple_build.sh build
    run "test_run.sh (engram run vs serial apply)" sh tests/test_run.sh build
    run "test_ple_run.sh (engram run on a PLE model vs serial apply)" sh tests/test_ple_run.sh build
    run "test_fallback.sh (refusals: same outputs)" sh tests/test_fallback.sh build
    run "test_outputs.sh (full disk, SIGKILL)" sh tests/test_outputs.sh build
    run "test_files.sh (devices, FIFOs, links, same file, memory limits)" sh tests/test_files.sh build
    run "test_envfail.sh (the CLI's environment failing)" sh tests/test_envfail.sh build
    run "test_inputs.sh (unbounded inputs, directories)" sh tests/test_inputs.sh build
    run "stress_sessions (64 threads, 5 s)" build/tests/stress_sessions --threads 64 --seconds 5
    run "fuzz_ple replay of its seeds" build/tests/fuzz_ple_replay tests/fuzz/ple_seeds/*
    for t in model tokmap cli residual ple; do
        nonempty "tests/fuzz/regressions/$t" &&
            run "fuzz_$t replay of its regressions" build/tests/fuzz_${t}_replay tests/fuzz/regressions/$t/*
        nonempty "tests/fuzz/corpus/$t" &&
            run "fuzz_$t replay of its campaign corpus" build/tests/fuzz_${t}_replay tests/fuzz/corpus/$t/*
    done
    if [ -x build/cuda/test_cuda ]; then  # built when nvcc is present
        run "test_cuda (GPU checks, or the no-GPU report)" build/cuda/test_cuda
        run "test_ple_cuda (PLE GPU checks, or no-GPU)" build/cuda/test_ple_cuda
    fi
    if [ -x build/cuda/test_nccl ]; then  # libengram-nccl, built when nvcc is present
        run "test_nccl (NCCL refusals; with NCCL and a GPU the combine)" build/cuda/test_nccl
        # where NCCL's own header is installed (the CUDA toolkit's here), our
        # declarations of its ABI (cuda/nccl_abi.h) checked against it
        for inc in /usr/local/cuda/include /usr/include; do
            if [ -f "$inc/nccl.h" ]; then
                run "nccl-abi-check (cuda/nccl_abi.h against $inc/nccl.h)" make -s WERROR=1 nccl-abi-check NCCL_INC="$inc"
                break
            fi
        done
    fi
    run "emulate_ple (PLE kernels on the host vs CPU)" build/cuda/emulate_ple
    # the Python binding (Debian's /usr/bin/python3: numpy, torch, pytest)
    if run "build: python module (make python)" make -j"$JOBS" WERROR=1 python; then
        run "pytest tests/python (binding vs CLI and C API)" env ENGRAM_BUILD=build \
            /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python
        run "test_abi3.sh (the one module under every Python 3.8+ here)" sh tests/test_abi3.sh build
    fi
    run "test_pip.sh (pip install ./python: one abi3 wheel, static)" sh tests/test_pip.sh
    # libengram-mpi (built where mpicc is found; deps.sh installs Open MPI)
    if have_mpi; then
        run "test_mpi.sh (mpirun -np 2 and 4)" sh tests/test_mpi.sh build
        run "test_run_mpi_faults.sh (a rank killed or stopped mid-decode)" sh tests/test_run_mpi_faults.sh build
    fi
    sh tests/fuzz/make_seeds.sh "$SEEDS" build/engram
}
# (the second stream runs the CLI's scripts on this build: marked asan)
marked_build asan "asan+ubsan" SANITIZE=address,undefined && {
    suite "asan+ubsan: " build-san-address,undefined
    # libengram-mpi's test (not in `all` of sanitizer builds: named here)
    if have_mpi; then
        run "asan+ubsan: build test_mpi_combine, test_mpi_exchange" make -j"$JOBS" WERROR=1 SANITIZE=address,undefined \
            build-san-address,undefined/tests/mpi/test_mpi_combine build-san-address,undefined/tests/mpi/test_mpi_exchange
        run "asan+ubsan: test_mpi.sh (mpirun -np 2)" sh tests/test_mpi.sh build-san-address,undefined 2
    fi
    run "asan+ubsan: fuzz_model replay of seeds" build-san-address,undefined/tests/fuzz_model_replay "$SEEDS"/*
    run "asan+ubsan: fuzz_tokmap replay of seeds" build-san-address,undefined/tests/fuzz_tokmap_replay tests/fuzz/tokmap_seeds/*
    run "asan+ubsan: fuzz_cli replay of seeds" build-san-address,undefined/tests/fuzz_cli_replay tests/fuzz/cli_seeds/*
    run "asan+ubsan: fuzz_residual replay of seeds" build-san-address,undefined/tests/fuzz_residual_replay tests/fuzz/residual_seeds/*
    run "asan+ubsan: fuzz_ple replay of seeds" build-san-address,undefined/tests/fuzz_ple_replay tests/fuzz/ple_seeds/*
    for t in model tokmap cli residual ple; do
        nonempty "tests/fuzz/regressions/$t" &&
            run "asan+ubsan: fuzz_$t regressions" build-san-address,undefined/tests/fuzz_${t}_replay tests/fuzz/regressions/$t/*
        nonempty "tests/fuzz/corpus/$t" &&
            run "asan+ubsan: fuzz_$t campaign corpus" build-san-address,undefined/tests/fuzz_${t}_replay tests/fuzz/corpus/$t/*
    done
}
wait "$second_pid"
cat "$LOG/second.log"
if read -r p2 f2 <"$LOG/second.count"; then
    pass=$((pass + p2))
    fail=$((fail + f2))
else
    echo "FAIL the second stream (TSan, clang, libFuzzer, the ASan+UBSan scripts) reported nothing"
    fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
