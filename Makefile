# engram - plain Makefile.
#   make                 library (static + shared), CLI, tests, benchmarks in build/
#   make test            the whole suite (tests/run.sh): plain, ASan+UBSan and TSan builds
#   make run             build the demo model and run the main job on it
#   make SANITIZE=address,undefined   a sanitizer build in build-san-address,undefined/
#   make WERROR=1        warnings are errors (CI)
#
# Exact code paths (hash, row decode, BF16 rounding) must not be compiled with
# fast-math or FP contraction: -fno-fast-math -ffp-contract=off below are for
# every file.  SIMD kernels use target attributes and run-time dispatch, so the
# build never uses -march=native and the binaries run on any x86-64.

CC      ?= cc
OPT     ?= -O2
BUILD   ?= build
SANITIZE ?=
WERROR  ?=

WARN = -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
       -Wformat=2 -Wvla -Wpointer-arith -Wundef -Wcast-qual -Wwrite-strings
ifeq ($(WERROR),1)
WARN += -Werror
endif

CFLAGS_ALL = -std=c11 -D_GNU_SOURCE $(OPT) -g -fPIC -fno-fast-math -ffp-contract=off \
             -fvisibility=hidden $(WARN) -Iinclude -Isrc $(CFLAGS)
# libengram (the runtime an engine links) needs liburing and libpthread only;
# libengram-tools (token map, layout generator, quantizer, builder) adds
# jansson and utf8proc.
LDLIBS_CORE  = -luring -lpthread -lm
LDLIBS_TOOLS = -ljansson -lutf8proc
LDLIBS_ALL = $(LDLIBS_TOOLS) $(LDLIBS_CORE) $(LDLIBS)

# The PLE kernels run on the host (cuda/emulate_ple.cpp; g++, no nvcc), in
# builds without sanitizers
EMULATE = $(BUILD)/cuda/emulate_ple
ifneq ($(SANITIZE),)
EMULATE :=
BUILD := build-san-$(SANITIZE)
CFLAGS_ALL += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZE)
SO_CHECK =
else
SO_CHECK = -Wl,--no-undefined
endif

# src/ holds one folder per stage of the pipeline (SPEC.md section 1):
# common/ format/ hash/ codec/ io/ serve/ output/ make libengram, the
# runtime; tools/ (token map, layout generator, quantizer, builder, GGUF
# writer, SHA-256) makes libengram-tools.
STAGES    = common format hash codec io serve output
TOOLS_SRC = $(wildcard src/tools/*.c)
CORE_SRC  = $(foreach d,$(STAGES),$(wildcard src/$(d)/*.c))
SRC_H     = $(wildcard src/*/*.h)
CORE_OBJ  = $(patsubst src/%.c,$(BUILD)/obj/%.o,$(CORE_SRC))
TOOLS_OBJ = $(patsubst src/%.c,$(BUILD)/obj/%.o,$(TOOLS_SRC))
# The tools' shared library carries hidden copies of the internal helpers it
# shares with the runtime (error filling, the GGUF type table).
TOOLS_SO_EXTRA = $(BUILD)/obj/common/util.o $(BUILD)/obj/format/gguf.o
LIBS = $(BUILD)/libengram-tools.a $(BUILD)/libengram.a
TEST_SRC = $(filter-out tests/test_faults_%.c tests/test_interleave.c tests/test_service.c,$(wildcard tests/test_*.c))
FAULT_TESTS = $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_faults_*.c))
TESTS    = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC)) $(FAULT_TESTS) \
           $(BUILD)/tests/test_interleave $(BUILD)/tests/test_service
BENCH_SRC = $(wildcard bench/*.c)
BENCHES  = $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
VERSION  = $(shell sed -n 's/^\#define ENGRAM_VERSION "\(.*\)"/\1/p' include/engram.h)

# The CUDA path (cuda/): built when nvcc is found (CUDA=0 turns it off) and
# only in builds without sanitizers.  CI has no GPU: it compiles and links
# it, and test_cuda checks that it reports why it cannot run.
CUDA ?= auto
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(CUDA),0)
override NVCC :=
endif
ifneq ($(SANITIZE),)
override NVCC :=
endif
ifneq ($(NVCC),)
# The toolkit's root as nvcc itself reports it: the nvcc on PATH may be a
# wrapper script (/usr/local/bin/nvcc exec'ing the real one), whose own
# directory has no include/ or lib64/.
CUDA_HOME := $(if $(CUDA_HOME),$(CUDA_HOME),$(realpath $(shell $(NVCC) --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^\#\$$ TOP=//p')))
ifeq ($(wildcard $(CUDA_HOME)/include/cuda_runtime.h),)
$(warning nvcc ($(NVCC)) found but no cuda_runtime.h under '$(CUDA_HOME)': the CUDA part is not built (set CUDA_HOME))
override NVCC :=
endif
endif
ifneq ($(NVCC),)
# Machine code for Hopper (sm_90a: the promoted GEMM's wgmma) and compute_90
# PTX for later GPUs, where the library probes that the wgmma kernel is not
# in the code it runs and takes cuBLAS's GEMM instead.
CUDA_ARCH ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90
NVFLAGS = -std=c++17 -O2 -g $(CUDA_ARCH) -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra -Iinclude -Isrc $(NVDEFS)
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart_static -ldl -lrt -lpthread
CUDA_LIB = $(BUILD)/libengram-cuda.a
CUDA_TARGETS = $(CUDA_LIB) $(BUILD)/cuda/test_cuda $(BUILD)/cuda/bench_cuda $(BUILD)/cuda/bench_ds4 \
               $(BUILD)/engram-cuda.so \
               $(BUILD)/cuda/test_ple_cuda $(BUILD)/cuda/bench_ple_cuda
CLI_CUDA = -DENGRAM_HAVE_CUDA -I$(CUDA_HOME)/include
# CUDA_KERNELS=0: the C side of the CUDA path only (the CLI's plugin source
# compiled to an object with $(CC), libengram-nccl), no nvcc.  nvcc compiles
# the .cu files with its own host compiler whatever CC is, so a second build
# with another CC (the suite's clang build) would only repeat them.
ifeq ($(CUDA_KERNELS),0)
CUDA_TARGETS = $(BUILD)/obj/cuda_c/device_cuda.o
endif
endif

.PHONY: all lib test run bench clean deps fuzz install python
all: lib $(BUILD)/engram $(TESTS) $(BENCHES) $(BUILD)/tests/fuzz_model_replay \
     $(BUILD)/tests/fuzz_tokmap_replay $(BUILD)/tests/fuzz_cli_replay \
     $(BUILD)/tests/fuzz_residual_replay $(BUILD)/tests/fuzz_ple_replay $(BUILD)/tests/seccomp_run \
     $(BUILD)/tests/rusage_run \
     $(BUILD)/tests/envfail_preload.so $(BUILD)/tests/fixed_random_preload.so $(BUILD)/tests/stress_sessions $(BUILD)/tests/race_abort_begin \
     $(CUDA_TARGETS) $(EMULATE)
lib: $(BUILD)/libengram.a $(BUILD)/libengram.so $(BUILD)/libengram-tools.a $(BUILD)/libengram-tools.so

$(BUILD)/obj/%.o: src/%.c include/engram.h include/engram_tools.h $(SRC_H) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DENGRAM_BUILDING -c $< -o $@

# The library once more with the pause points of src/serve/sched_points.h live
# (-DENGRAM_SCHED) in the files that have them (the pool's and the thread
# engine's), for tests/test_interleave.c only: never installed.
SCHED_SRC = $(wildcard src/serve/*.c) src/io/io_threads.c
SCHED_OBJ = $(filter-out $(patsubst src/%.c,$(BUILD)/obj/%.o,$(SCHED_SRC)),$(CORE_OBJ)) \
            $(patsubst src/%.c,$(BUILD)/obj-sched/%.o,$(SCHED_SRC))
$(BUILD)/obj-sched/%.o: src/%.c include/engram.h $(SRC_H) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DENGRAM_BUILDING -DENGRAM_SCHED -c $< -o $@

$(BUILD)/libengram-sched.a: $(SCHED_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libengram.a: $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libengram.so: $(CORE_OBJ)
	$(CC) -shared -Wl,-soname,libengram.so.0 $(SO_CHECK) $(LDFLAGS) -o $@ $^ $(LDLIBS_CORE)

$(BUILD)/libengram-tools.a: $(TOOLS_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libengram-tools.so: $(TOOLS_OBJ) $(TOOLS_SO_EXTRA) $(BUILD)/libengram.so
	$(CC) -shared -Wl,-soname,libengram-tools.so.0 $(SO_CHECK) $(LDFLAGS) -o $@ \
	    $(TOOLS_OBJ) $(TOOLS_SO_EXTRA) -L$(BUILD) -lengram $(LDLIBS_TOOLS) $(LDLIBS_CORE)

# The bundled token stream, compiled into the CLI (engram run's default).
$(BUILD)/gen/bundled_tokens.c: data/gpl3.tok
	@mkdir -p $(dir $@)
	@{ echo '/* generated from data/gpl3.tok by the Makefile */'; \
	  echo '#include <stddef.h>'; echo '#include <stdint.h>'; \
	  echo 'extern const uint32_t engram_bundled_tokens[];'; \
	  echo 'extern const size_t engram_bundled_tokens_n;'; \
	  echo 'const uint32_t engram_bundled_tokens[] = {'; \
	  tr -s ' \t\r\n' '\n\n\n\n' < $< | grep -v '^$$' | sed 's/$$/u,/' | paste -sd' ' - | fold -s -w 100; \
	  echo '};'; \
	  echo 'const size_t engram_bundled_tokens_n = sizeof engram_bundled_tokens / sizeof engram_bundled_tokens[0];'; \
	} > $@

$(BUILD)/engram: $(wildcard programs/*.c) $(wildcard programs/*.h) $(wildcard include/*.h) $(BUILD)/gen/bundled_tokens.c $(LIBS)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -o $@ $(wildcard programs/*.c) $(BUILD)/gen/bundled_tokens.c \
	    $(LIBS) $(LDLIBS_ALL) -ldl

# The CLI's CUDA plugin's source alone (CUDA_KERNELS=0, above)
$(BUILD)/obj/cuda_c/device_cuda.o: programs/cuda/device_cuda.c programs/device_plugin.h include/engram_cuda.h \
    include/engram.h Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(CLI_CUDA) -c $< -o $@

# The CLI's CUDA plugin, loaded by `engram ... --device cuda` (programs/device.c)
$(BUILD)/engram-cuda.so: programs/cuda/device_cuda.c programs/device_plugin.h $(CUDA_LIB) $(LIBS)
	$(CC) $(CFLAGS_ALL) $(CLI_CUDA) $(LDFLAGS) -shared -o $@ $< -Wl,--whole-archive $(CUDA_LIB) \
	    -Wl,--no-whole-archive $(LIBS) $(LDLIBS_ALL) $(CUDA_LIBS) -lstdc++

ifneq ($(NVCC),)
$(BUILD)/obj/engram_cuda.o: cuda/engram_cuda.cu $(filter-out cuda/ple_%,$(wildcard cuda/*.cuh)) include/engram_cuda.h include/engram.h Makefile
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

# The PLE output stage on the GPU (cuda/ple_cuda.h, internal, in progress)
$(BUILD)/obj/ple_cuda.o: cuda/ple_cuda.cu cuda/ple_cuda.h cuda/ple_kernels.cuh cuda/host_err.cuh src/output/ple_apply.h include/engram.h Makefile
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(CUDA_LIB): $(BUILD)/obj/engram_cuda.o $(BUILD)/obj/ple_cuda.o
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/cuda/%: cuda/%.cu cuda/cuda_check.h cuda/ple_cuda.h $(CUDA_LIB) $(LIBS) tests/testutil.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -o $@ $< $(CUDA_LIB) $(LIBS) -Xlinker -rpath,$(CUDA_HOME)/lib64 -lcublas \
	    $(patsubst -Wl$(comma)%,,$(LDLIBS_ALL)) $(CUDA_WRAP_$(notdir $@))
# test_ple_cuda counts the cudaMalloc calls of an apply (none)
CUDA_WRAP_test_ple_cuda = -Xlinker --wrap=cudaMalloc
# test_cuda fails chosen calls of the library (allocations, cuBLAS set-up and GEMM, cudaMalloc)
CUDA_WRAP_test_cuda = -Xlinker --wrap=calloc,--wrap=malloc,--wrap=cudaMalloc,--wrap=cublasCreate_v2 \
	-Xlinker --wrap=cublasSetMathMode,--wrap=cublasGemmEx,--wrap=cudaGetDriverEntryPointByVersion \
	-Xlinker --wrap=cudaFuncSetAttribute,--wrap=cudaStreamCreateWithFlags,--wrap=cudaStreamBeginCapture \
	-Xlinker --wrap=cudaGraphInstantiate,--wrap=cudaGraphLaunch,--wrap=cudaStreamDestroy \
	-Xlinker --wrap=cudaStreamEndCapture,--wrap=cudaGraphDestroy,--wrap=cudaLaunchKernelExC \
	-Xlinker --wrap=cudaGraphUpload,--wrap=cudaGraphExecDestroy
endif
comma := ,

# The PLE kernels compiled for the host, a CUDA thread a fiber
# (cuda/emulate_ple.cpp): their logic checked against the CPU path where no
# GPU is.  Needs no nvcc; built on demand.
$(BUILD)/cuda/emulate_ple: cuda/emulate_ple.cpp cuda/ple_kernels.cuh $(LIBS) Makefile
	@mkdir -p $(dir $@)
	$(CXX) -std=c++20 -O1 -g -fno-fast-math -ffp-contract=off -Wall -Wextra -Wno-unknown-pragmas $(if $(filter 1,$(WERROR)),-Werror) \
	    -Iinclude -Isrc -Icuda -o $@ $< $(LIBS) $(LDLIBS_ALL)

$(BUILD)/tests/%: tests/%.c tests/testutil.h $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -o $@ $< $(LIBS) $(LDLIBS_ALL)

# The tests that count or fail allocations link the one allocation
# interposer, tests/alloc_shim.c, each wrapping the calls it fails.
ALLOC_SHIM = tests/alloc_shim.c tests/alloc_shim.h
$(BUILD)/tests/test_apply: tests/test_apply.c tests/testutil.h $(ALLOC_SHIM) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -o $@ $< tests/alloc_shim.c $(LIBS) $(LDLIBS_ALL)
$(BUILD)/tests/test_ple_apply: tests/test_ple_apply.c tests/testutil.h $(ALLOC_SHIM) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -o $@ $< tests/alloc_shim.c $(LIBS) $(LDLIBS_ALL)

# Fault injection (test builds only): the test_faults_* programs, one area
# each (tests/faults.h), route the reader's engine constructors and the
# library's system and library calls through the wrappers in
# tests/fault_engine.h, tests/fault_shim.c and tests/alloc_shim.c.
FAULT_WRAP = -Wl,--wrap=io_uring_engine_new,--wrap=io_threads_engine_new,--wrap=open,--wrap=statx,--wrap=pwrite \
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=posix_memalign,--wrap=pthread_create,--wrap=pthread_attr_init,--wrap=mmap,--wrap=pread,--wrap=preadv2 \
  -Wl,--wrap=io_uring_queue_init_params,--wrap=io_uring_register_files,--wrap=io_uring_register_buffers,--wrap=io_uring_submit
FAULT_SHIM = tests/faults.h tests/fault_engine.h tests/fault_shim.c tests/fault_shim.h $(ALLOC_SHIM)
$(FAULT_TESTS): $(BUILD)/tests/%: tests/%.c $(FAULT_SHIM) tests/testutil.h $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) $(FAULT_WRAP) -o $@ $< tests/fault_shim.c tests/alloc_shim.c $(LIBS) $(LDLIBS_ALL)

# The pool's service order read by read: its engines behind a gate
# (tests/fault_engine.h).
$(BUILD)/tests/test_service: tests/test_service.c tests/fault_engine.h tests/testutil.h $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -Wl,--wrap=io_uring_engine_new,--wrap=io_threads_engine_new -o $@ $< \
	    $(LIBS) $(LDLIBS_ALL)

# The interleaving explorer: the sched build of the library, its engines
# replaced by a deterministic one (tests/test_interleave.c).
$(BUILD)/tests/test_interleave: tests/test_interleave.c tests/testutil.h $(BUILD)/libengram-sched.a $(BUILD)/libengram-tools.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -Wl,--wrap=io_uring_engine_new,--wrap=io_threads_engine_new -o $@ $< \
	    $(BUILD)/libengram-tools.a $(BUILD)/libengram-sched.a $(LDLIBS_ALL)

$(BUILD)/tests/test_tools: tests/test_tools.c tests/testutil.h $(ALLOC_SHIM) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -Wl,--wrap=malloc,--wrap=read -o $@ $< tests/alloc_shim.c $(LIBS) $(LDLIBS_ALL)

$(BUILD)/tests/test_parsers: tests/test_parsers.c programs/cli.c programs/device.c programs/cli.h tests/testutil.h \
    $(ALLOC_SHIM) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -Wl,--wrap=malloc,--wrap=realloc,--wrap=calloc -o $@ $< programs/cli.c \
	    programs/device.c tests/alloc_shim.c $(LIBS) $(LDLIBS_ALL) -ldl

$(BUILD)/tests/envfail_preload.so: tests/envfail_preload.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -fPIC -shared -Wall -Wextra -o $@ $< -ldl

$(BUILD)/tests/fixed_random_preload.so: tests/fixed_random_preload.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -fPIC -shared -Wall -Wextra -o $@ $< -ldl

$(BUILD)/tests/seccomp_run: tests/seccomp_run.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -o $@ $<

$(BUILD)/tests/rusage_run: tests/rusage_run.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -o $@ $<

# The fuzz targets as standalone replayers (any compiler) ...
$(BUILD)/tests/fuzz_cli_replay: tests/fuzz/fuzz_cli.c programs/cli.c programs/cli.h tests/fuzz/replay_main.h $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DFUZZ_REPLAY $(LDFLAGS) -o $@ $< programs/cli.c $(LIBS) $(LDLIBS_ALL)
$(BUILD)/tests/fuzz_%_replay: tests/fuzz/fuzz_%.c tests/fuzz/replay_main.h $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DFUZZ_REPLAY $(LDFLAGS) -o $@ $< $(LIBS) $(LDLIBS_ALL)

# ... and as a libFuzzer target (clang with compiler-rt): make fuzz
FUZZ_FLAGS = -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
# (the library first, instrumented, by a make of its own; then the five
# targets, each its own rule, in parallel under `make -jN fuzz`; a target
# alone, `make build-fuzz/fuzz_model`, needs the library made by `make fuzz`)
FUZZ_BINS = $(patsubst %,build-fuzz/fuzz_%,model tokmap cli residual ple)
FUZZ_LIBS = build-fuzz/libengram-tools.a build-fuzz/libengram.a
fuzz:
	$(MAKE) CC=clang BUILD=build-fuzz CFLAGS="-fsanitize=fuzzer-no-link,address,undefined" \
	    LDFLAGS="-fsanitize=address,undefined" $(FUZZ_LIBS)
	$(MAKE) $(FUZZ_BINS)
build-fuzz/fuzz_cli: programs/cli.c programs/cli.h
$(FUZZ_BINS): build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/replay_main.h tests/testutil.h \
    $(wildcard include/*.h) $(SRC_H) $(FUZZ_LIBS)
	clang $(filter-out -fvisibility=hidden,$(CFLAGS_ALL)) $(FUZZ_FLAGS) -o $@ \
	    $< $(filter %.c,$(filter-out $<,$^)) $(FUZZ_LIBS) $(LDLIBS_ALL)

$(BUILD)/bench/%: bench/%.c $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -o $@ $< $(LIBS) $(LDLIBS_ALL)

# The Python module (python/): engram._engram against CPython's limited API
# of 3.8 (one abi3 build for every Python >= 3.8), libengram linked in
# statically (at run time it needs liburing only), into build/python/ with
# the package's Python files.  PYTHON names the interpreter whose headers it
# is built with (Debian's: python3-dev); `pip install ./python` builds the
# same through python/setup.py.
PYTHON ?= /usr/bin/python3
PY_INC = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PY_SRC = $(filter-out python/src/cuda.c,$(wildcard python/src/*.c))
PY_FILES = $(wildcard python/engram/*.py python/engram/*.pyi python/engram/py.typed)
PY_MOD = $(BUILD)/python/engram/_engram.abi3.so
.PHONY: python
python: $(PY_MOD) $(patsubst python/engram/%,$(BUILD)/python/engram/%,$(PY_FILES))
$(PY_MOD): $(PY_SRC) python/src/ext.h include/engram.h $(BUILD)/libengram.a Makefile
	@test -f "$(PY_INC)/Python.h" || { echo "make python: no Python.h for $(PYTHON) (install python3-dev)"; exit 1; }
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -Wpedantic -Wcast-qual -Wwrite-strings,$(CFLAGS_ALL)) -Wno-missing-field-initializers -isystem $(PY_INC) \
	    -DPy_LIMITED_API=0x03080000 -shared $(LDFLAGS) -Wl,--exclude-libs,ALL -o $@ $(PY_SRC) $(BUILD)/libengram.a \
	    $(LDLIBS_CORE)
# engram._engram_cuda (engram.cuda, python/src/cuda.c with ext.c's helpers),
# where nvcc is found: libengram-cuda, cuBLAS (dynamic), the CUDA runtime (static)
ifneq ($(NVCC),)
PY_CUDA_MOD = $(BUILD)/python/engram/_engram_cuda.abi3.so
python: $(PY_CUDA_MOD)
$(PY_CUDA_MOD): python/src/cuda.c python/src/ext.c python/src/ext.h include/engram_cuda.h include/engram.h \
                $(CUDA_LIB) $(BUILD)/libengram.a Makefile
	@test -f "$(PY_INC)/Python.h" || { echo "make python: no Python.h for $(PYTHON) (install python3-dev)"; exit 1; }
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -Wpedantic -Wcast-qual -Wwrite-strings,$(CFLAGS_ALL)) -Wno-missing-field-initializers \
	    -isystem $(PY_INC) -isystem $(CUDA_HOME)/include -DPy_LIMITED_API=0x03080000 -shared $(LDFLAGS) -Wl,--exclude-libs,ALL -o $@ \
	    python/src/cuda.c python/src/ext.c $(CUDA_LIB) $(BUILD)/libengram.a $(LDLIBS_CORE) $(CUDA_LIBS) -lstdc++
endif
$(BUILD)/python/engram/%: python/engram/%
	@mkdir -p $(dir $@)
	cp $< $@

# ---- libengram-mpi (src/mpi/, include/engram_mpi.h; issue #24) ----
# The ranks' shares of a sharded pool combined over MPI: a library of its own,
# built only when mpicc is found (MPI=0 turns it off); libengram itself
# never sees mpi.h.  In sanitizer builds none of it is part of `all`; its
# test is built when named (tests/run.sh: under ASan+UBSan, run by mpirun;
# Open MPI itself is not instrumented).  Compiled with $(CC)
# and the flags Open MPI's wrapper names (--showme:compile / :link), its
# include directories as -isystem (mpi.h is not written for our warnings).
# Its test, tests/mpi/test_mpi_combine.c, goes to build/tests/mpi/ (not
# build/tests/test_*: the suite runs it under mpirun, tests/test_mpi.sh).
MPI ?= auto
MPICC ?= $(shell command -v mpicc 2>/dev/null)
ifeq ($(MPI),0)
override MPICC :=
endif
ifneq ($(MPICC),)
MPI_CFLAGS := $(patsubst -I%,-isystem %,$(shell $(MPICC) --showme:compile 2>/dev/null))
MPI_LIBS := $(shell $(MPICC) --showme:link 2>/dev/null)
ifeq ($(MPI_LIBS),)
$(warning mpicc ($(MPICC)) found but it does not answer --showme:link (not Open MPI?): libengram-mpi is not built)
override MPICC :=
endif
endif
ifneq ($(MPICC),)
ifeq ($(SANITIZE),)
MPI_TARGETS = $(BUILD)/libengram-mpi.a $(BUILD)/libengram-mpi.so $(BUILD)/tests/mpi/test_mpi_combine \
              $(BUILD)/tests/mpi/test_mpi_exchange $(BUILD)/bench/mpi/bench_mpi $(BUILD)/engram-mpi.so
all: $(MPI_TARGETS)
endif
$(BUILD)/obj/mpi/engram_mpi.o: src/mpi/engram_mpi.c include/engram_mpi.h include/engram.h src/common/error_fill.h Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(MPI_CFLAGS) -DENGRAM_BUILDING -c $< -o $@
$(BUILD)/libengram-mpi.a: $(BUILD)/obj/mpi/engram_mpi.o
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libengram-mpi.so: $(BUILD)/obj/mpi/engram_mpi.o $(BUILD)/libengram.so
	$(CC) -shared -Wl,-soname,libengram-mpi.so.0 $(SO_CHECK) $(LDFLAGS) -o $@ $< -L$(BUILD) -lengram \
	    $(MPI_LIBS) -lpthread
$(BUILD)/tests/mpi/test_mpi_combine: tests/mpi/test_mpi_combine.c tests/testutil.h include/engram_mpi.h \
    $(BUILD)/libengram-mpi.a $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(MPI_CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libengram-mpi.a $(LIBS) $(LDLIBS_ALL) \
	    $(MPI_LIBS)
# The DP exchange's test (tests/test_mpi.sh runs it under mpirun too).
$(BUILD)/tests/mpi/test_mpi_exchange: tests/mpi/test_mpi_exchange.c tests/testutil.h include/engram_mpi.h \
    $(BUILD)/libengram-mpi.a $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(MPI_CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libengram-mpi.a $(LIBS) $(LDLIBS_ALL) \
	    $(MPI_LIBS)
# Issue #24's benchmark (run under mpirun: bench/mpi_bench.sh), in build/bench/mpi/.
$(BUILD)/bench/mpi/bench_mpi: bench/mpi/bench_mpi.c include/engram_mpi.h $(BUILD)/libengram-mpi.a $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(MPI_CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libengram-mpi.a $(LIBS) $(LDLIBS_ALL) \
	    $(MPI_LIBS)
# The CLI's MPI plugin, loaded by `engram run --shard` (programs/run_shard.c):
# the engram binary itself never links MPI.
$(BUILD)/engram-mpi.so: programs/mpi/run_mpi.c programs/mpi_plugin.h include/engram_mpi.h \
    $(BUILD)/libengram-mpi.a $(LIBS)
	$(CC) $(CFLAGS_ALL) $(MPI_CFLAGS) $(LDFLAGS) -shared -o $@ $< $(BUILD)/libengram-mpi.a $(LIBS) \
	    $(LDLIBS_ALL) $(MPI_LIBS)
# make install adds the header, both libraries, engram-mpi.pc and the plugin
.PHONY: install-mpi
install: install-mpi
install-mpi: $(BUILD)/libengram-mpi.a $(BUILD)/libengram-mpi.so $(BUILD)/engram-mpi.so
	@d="$(DESTDIR)$(PREFIX)"; set -e; \
	mkdir -p "$$d/include" "$$d/lib/pkgconfig"; \
	cp include/engram_mpi.h "$$d/include/"; \
	mkdir -p "$$d/lib/engram"; cp $(BUILD)/engram-mpi.so "$$d/lib/engram/"; \
	cp $(BUILD)/libengram-mpi.a "$$d/lib/"; \
	cp $(BUILD)/libengram-mpi.so "$$d/lib/libengram-mpi.so.0"; \
	ln -sf libengram-mpi.so.0 "$$d/lib/libengram-mpi.so"; \
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@MPI_CFLAGS@|$(MPI_CFLAGS)|' \
	    -e 's|@MPI_LIBS@|$(MPI_LIBS)|' tools/pkgconfig/engram-mpi.pc.in > "$$d/lib/pkgconfig/engram-mpi.pc"
endif
# ---- end of libengram-mpi ----

# ---- libengram-nccl (cuda/engram_nccl.c, include/engram_nccl.h; issue #24) ----
# The sharded rows' combine on device buffers with NCCL, where the CUDA part
# is built (nvcc found).  NCCL is dlopen'd at run time (cuda/nccl_abi.h
# declares what is used), so it builds with no nccl.h and refuses cleanly
# with no libnccl; libengram never sees NCCL.  C, compiled with $(CC) and
# the CUDA runtime's headers; no kernels.  test_nccl (build/cuda/) runs
# everywhere: refusals without NCCL or a GPU, the combine where both exist.
# `make nccl-abi-check NCCL_INC=DIR` checks cuda/nccl_abi.h against the
# real nccl.h in DIR (the GPU machine's).
ifneq ($(NVCC),)
NCCL_CFLAGS = -isystem $(CUDA_HOME)/include -Icuda
NCCL_LDLIBS = -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread
NCCL_TARGETS = $(BUILD)/libengram-nccl.a $(BUILD)/libengram-nccl.so $(BUILD)/cuda/test_nccl \
               $(BUILD)/cuda/nccl_stub.so $(BUILD)/cuda/nccl_stub_all.so $(BUILD)/cuda/nccl_stub_faults.so
all: $(NCCL_TARGETS)
$(BUILD)/obj/nccl/engram_nccl.o: cuda/engram_nccl.c cuda/nccl_abi.h include/engram_nccl.h include/engram.h \
    src/common/error_fill.h Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(NCCL_CFLAGS) -DENGRAM_BUILDING -c $< -o $@
$(BUILD)/libengram-nccl.a: $(BUILD)/obj/nccl/engram_nccl.o
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libengram-nccl.so: $(BUILD)/obj/nccl/engram_nccl.o
	$(CC) -shared -Wl,-soname,libengram-nccl.so.0 $(SO_CHECK) $(LDFLAGS) -o $@ $< $(NCCL_LDLIBS)
# (the stubs it loads are built with it: order-only, not linked)
$(BUILD)/cuda/test_nccl: cuda/test_nccl.c cuda/nccl_abi.h tests/testutil.h include/engram_nccl.h \
    $(BUILD)/libengram-nccl.a $(LIBS) | $(BUILD)/cuda/nccl_stub.so $(BUILD)/cuda/nccl_stub_all.so \
    $(BUILD)/cuda/nccl_stub_faults.so
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(NCCL_CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libengram-nccl.a $(LIBS) $(LDLIBS_ALL) \
	    $(NCCL_LDLIBS)
$(BUILD)/cuda/nccl_stub.so: cuda/nccl_stub.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -fvisibility=default -shared -o $@ $<
$(BUILD)/cuda/nccl_stub_all.so: cuda/nccl_stub.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -fvisibility=default -DSTUB_ALL -shared -o $@ $<
$(BUILD)/cuda/nccl_stub_faults.so: cuda/nccl_stub.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -fvisibility=default -DSTUB_FAULTS -shared -o $@ $<
# make install adds the header, both libraries and engram-nccl.pc (NCCL
# itself is not linked: it is loaded at run time; the CUDA runtime is)
.PHONY: install-nccl
install: install-nccl
install-nccl: $(BUILD)/libengram-nccl.a $(BUILD)/libengram-nccl.so
	@d="$(DESTDIR)$(PREFIX)"; set -e; \
	mkdir -p "$$d/include" "$$d/lib/pkgconfig"; \
	cp include/engram_nccl.h "$$d/include/"; \
	cp $(BUILD)/libengram-nccl.a "$$d/lib/"; \
	cp $(BUILD)/libengram-nccl.so "$$d/lib/libengram-nccl.so.0"; \
	ln -sf libengram-nccl.so.0 "$$d/lib/libengram-nccl.so"; \
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@CUDA_HOME@|$(CUDA_HOME)|' \
	    tools/pkgconfig/engram-nccl.pc.in > "$$d/lib/pkgconfig/engram-nccl.pc"
endif
.PHONY: nccl-abi-check
nccl-abi-check:
	@test -f "$(NCCL_INC)/nccl.h" || { echo "nccl-abi-check: no nccl.h in NCCL_INC='$(NCCL_INC)'"; exit 1; }
	@mkdir -p $(BUILD)/cuda
	$(CC) -std=c11 -Wall -Wextra -Werror -isystem $(NCCL_INC) -isystem $(CUDA_HOME)/include -Icuda \
	    -o $(BUILD)/cuda/nccl_abi_check cuda/nccl_abi_check.c
	$(BUILD)/cuda/nccl_abi_check
# ---- end of libengram-nccl ----

deps:
	@sh tools/deps.sh

test:
	@sh tests/run.sh

run:
	@sh tools/deps.sh --build
	@$(MAKE) --no-print-directory all
	@sh tools/run.sh

bench: all
	$(BUILD)/bench/bench_core

# make install [PREFIX=/usr/local] [DESTDIR=]: headers, both libraries
# (static and shared), their pkg-config files (engram, engram-tools) and
# the CLI.  Into the default prefix, as root and without DESTDIR, it runs
# ldconfig, so that programs linked with `pkg-config --libs engram` find
# libengram.so.0 at run time; anywhere else (or if the runtime linker still
# does not find it there) it prints one line saying how to tell it.
PREFIX ?= /usr/local
LIBDIR_HINT = note: unless the runtime linker searches $(PREFIX)/lib (ldconfig),
LIBDIR_HINT += run programs with LD_LIBRARY_PATH=$(PREFIX)/lib or link them with
install: lib $(BUILD)/engram
	@d="$(DESTDIR)$(PREFIX)"; set -e; \
	mkdir -p "$$d/include" "$$d/lib/pkgconfig" "$$d/bin"; \
	cp include/engram.h include/engram_tools.h "$$d/include/"; \
	cp $(BUILD)/libengram.a $(BUILD)/libengram-tools.a "$$d/lib/"; \
	cp $(BUILD)/libengram.so "$$d/lib/libengram.so.0"; \
	cp $(BUILD)/libengram-tools.so "$$d/lib/libengram-tools.so.0"; \
	ln -sf libengram.so.0 "$$d/lib/libengram.so"; \
	ln -sf libengram-tools.so.0 "$$d/lib/libengram-tools.so"; \
	for pc in engram engram-tools; do \
	    sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' tools/pkgconfig/$$pc.pc.in \
	        > "$$d/lib/pkgconfig/$$pc.pc"; \
	done; \
	cp $(BUILD)/engram "$$d/bin/"; \
	if [ -f $(BUILD)/engram-cuda.so ]; then \
	    mkdir -p "$$d/lib/engram"; cp $(BUILD)/engram-cuda.so "$$d/lib/engram/"; \
	    cp include/engram_cuda.h "$$d/include/"; cp $(BUILD)/libengram-cuda.a "$$d/lib/"; \
	fi; \
	echo "installed into $$d"; \
	if [ -z "$(DESTDIR)" ] && [ "$(PREFIX)" = /usr/local ] && [ "$$(id -u)" = 0 ] && \
	    ldconfig && ldconfig -p | grep -q "libengram\.so\.0 .*=> $(PREFIX)/lib/libengram\.so\.0$$"; then \
	    echo "ran ldconfig: $(PREFIX)/lib/libengram.so.0 is in the runtime linker's cache"; \
	else \
	    echo "$(LIBDIR_HINT)" '-Wl,-rpath,$$(pkg-config --variable=libdir engram)'; \
	fi

clean:
	rm -rf build build-san-* build-clang build-fuzz
