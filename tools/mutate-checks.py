#!/usr/bin/env python3
"""mutate-checks.py - drop error checks one at a time and see a test fail.

For each line of FILE (within the functions named) that returns or sets an
error (`return -E...`, `return -1;`, `return -errno;`, `return -e;`, `return err_set(...)`, `goto bad...`),
the statement is replaced by `;` (the check is dropped: execution goes on as
if the input were fine), the named build target is rebuilt and the test
command run.  A mutant the tests do not catch is a survivor, printed with
its line.  Outside the suite (each mutant is a rebuild):

  tools/mutate-checks.py FILE FUNC[,FUNC...] TARGET[,TARGET...] -- TEST COMMAND...

FUNC '*' takes every function of FILE.
MUT_LINES=N[,N...] keeps only the checks on those lines (1-based).
MUT_COLLECT=DIR: a mutant the test here does not catch is not reported as a
survivor; the last TARGET (a file) is copied to DIR/NAME.LLINE, to be run
where the test can reach it (the CUDA code: test_cuda on a GPU machine).
TARGET may also be a make variable (VAR=VALUE), passed to each make.
A test command that runs past MUT_TIMEOUT seconds (default 60) counts as
caught (the mutant hangs it) and is reported as such.
  e.g. tools/mutate-checks.py programs/cli.c parse_numbers,parse_history,npy_parse \\
       build/tests/test_parsers -- build/tests/test_parsers
  or, with one area's fault scenarios (TF_ONLY: those whose names hold it):
       tools/mutate-checks.py src/serve/prefetch.c '*' \\
       build/tests/test_session,build/tests/test_faults_pools -- sh -c \\
       'build/tests/test_session && TF_ONLY=prefill build/tests/test_faults_pools'
"""
import os
import re
import signal
import subprocess
import sys

def functions(lines, names):
    """line ranges [start, end) of the named C functions (a definition
    starts at column 0 and ends at the next line that is just '}')."""
    spans = []
    for i, l in enumerate(lines):
        m = re.match(r'^[A-Za-z].*\b(\w+)\(', l)
        if m and ('*' in names or m.group(1) in names) and not l.rstrip().endswith(';'):
            j = i + 1
            while j < len(lines) and lines[j].rstrip() != '}':
                j += 1
            spans.append((i, j))
    return spans

CHECK = re.compile(r'^(\s*)(return\s+(-E[A-Z]+|-1|-errno|-e|err_set\(.*\)|rc|set_err\(.*\))\s*;|goto\s+bad\w*\s*;)\s*(/\*.*\*/)?\s*$')

def main():
    a = sys.argv[1:]
    if '--' not in a or len(a) < 5:
        print(__doc__)
        return 2
    k = a.index('--')
    path, names, target, test = a[0], set(a[1].split(',')), a[2], a[k + 1:]
    src = open(path).read()
    lines = src.split('\n')
    sites = [i for s, e in functions(lines, names) for i in range(s, e) if CHECK.match(lines[i])]
    only = os.environ.get('MUT_LINES')  # e.g. MUT_LINES=63,232: just those lines' checks
    if only:
        sites = [i for i in sites if i + 1 in {int(x) for x in only.split(',')}]
    killed, hung, survivors, kept = 0, 0, [], []
    collect = os.environ.get('MUT_COLLECT')
    # SIGTERM / SIGHUP: leave through the finally below, which puts FILE back
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(1))
    targets = target.split(',')
    limit = int(os.environ.get('MUT_TIMEOUT', '60'))
    try:
        for i in sites:
            m = CHECK.match(lines[i])
            mutant = lines[:i] + [m.group(1) + ';'] + lines[i + 1:]
            open(path, 'w').write('\n'.join(mutant))
            b = subprocess.run(['make', '-s'] + targets, capture_output=True)
            if b.returncode != 0:
                killed += 1  # does not even build (e.g. an unused label): not a survivor
                continue
            # the test in its own process group, killed whole on a timeout (a
            # hung mutant under `sh -c` would otherwise outlive the shell)
            t = subprocess.Popen(test, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            try:
                caught = t.wait(timeout=limit) != 0
            except subprocess.TimeoutExpired:
                os.killpg(t.pid, signal.SIGKILL)
                t.wait()
                caught = True  # the mutant hangs the test: caught
                hung += 1
            if caught:
                killed += 1
            elif collect:  # kept for a run elsewhere (a GPU machine)
                dst = os.path.join(collect, '%s.L%d' % (os.path.basename(targets[-1]), i + 1))
                subprocess.run(['cp', targets[-1], dst], check=True)
                kept.append((i + 1, lines[i].strip()))
            else:
                survivors.append((i + 1, lines[i].strip()))
    finally:
        open(path, 'w').write(src)
        subprocess.run(['make', '-s'] + targets, capture_output=True)
    print('%s (%s): %d error checks dropped one at a time, %d caught by a test (%d of them by hanging it past %d s), %d survived'
          % (path, ','.join(sorted(names)), len(sites), killed, hung, limit, len(survivors)))
    for n, l in survivors:
        print('  survived: line %d: %s' % (n, l))
    for n, l in kept:
        print('  not caught here, binary kept in %s: line %d: %s' % (collect, n, l))
    return 1 if survivors else 0

sys.exit(main())
