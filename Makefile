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
LDLIBS_ALL = -luring -lutf8proc -ljansson -lpthread -lm $(LDLIBS)

ifneq ($(SANITIZE),)
BUILD := build-san-$(SANITIZE)
CFLAGS_ALL += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZE)
endif

LIB_SRC  = $(wildcard src/*.c)
LIB_OBJ  = $(patsubst src/%.c,$(BUILD)/obj/%.o,$(LIB_SRC))
TEST_SRC = $(wildcard tests/test_*.c)
TESTS    = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCH_SRC = $(wildcard bench/*.c)
BENCHES  = $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

.PHONY: all lib test run bench clean deps fuzz
all: lib $(BUILD)/engram $(TESTS) $(BENCHES) $(BUILD)/tests/fuzz_model_replay \
     $(BUILD)/tests/fuzz_tokmap_replay
lib: $(BUILD)/libengram.a $(BUILD)/libengram.so

$(BUILD)/obj/%.o: src/%.c include/engram.h $(wildcard src/*.h) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DENGRAM_BUILDING -c $< -o $@

$(BUILD)/libengram.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libengram.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libengram.so.0 $(LDFLAGS) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/engram: $(wildcard programs/*.c) $(wildcard programs/*.h) $(BUILD)/libengram.a
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -o $@ $(wildcard programs/*.c) $(BUILD)/libengram.a $(LDLIBS_ALL)

$(BUILD)/tests/%: tests/%.c tests/testutil.h $(BUILD)/libengram.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -o $@ $< $(BUILD)/libengram.a $(LDLIBS_ALL)

# Fault injection (test builds only): the reader's engine constructors and
# its open/statx calls are routed through tests/fault_engine.h's wrappers.
FAULT_WRAP = -Wl,--wrap=io_uring_engine_new,--wrap=io_threads_engine_new,--wrap=open,--wrap=statx \
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=posix_memalign,--wrap=pthread_create \
  -Wl,--wrap=io_uring_queue_init_params,--wrap=io_uring_register_files,--wrap=io_uring_register_buffers
$(BUILD)/tests/test_faults: tests/test_faults.c tests/fault_engine.h tests/testutil.h $(BUILD)/libengram.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) $(FAULT_WRAP) -o $@ $< $(BUILD)/libengram.a $(LDLIBS_ALL)

# The fuzz targets as standalone replayers (any compiler) ...
$(BUILD)/tests/fuzz_%_replay: tests/fuzz/fuzz_%.c tests/fuzz/replay_main.h $(BUILD)/libengram.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DFUZZ_REPLAY $(LDFLAGS) -o $@ $< $(BUILD)/libengram.a $(LDLIBS_ALL)

# ... and as a libFuzzer target (clang with compiler-rt): make fuzz
FUZZ_FLAGS = -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
fuzz:
	$(MAKE) CC=clang BUILD=build-fuzz CFLAGS="-fsanitize=fuzzer-no-link,address,undefined" \
	    LDFLAGS="-fsanitize=address,undefined" build-fuzz/libengram.a
	for t in model tokmap; do \
	    clang $(filter-out -fvisibility=hidden,$(CFLAGS_ALL)) $(FUZZ_FLAGS) -o build-fuzz/fuzz_$$t \
	        tests/fuzz/fuzz_$$t.c build-fuzz/libengram.a $(LDLIBS_ALL) || exit 1; \
	done

$(BUILD)/bench/%: bench/%.c $(BUILD)/libengram.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(LDFLAGS) -o $@ $< $(BUILD)/libengram.a $(LDLIBS_ALL)

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

clean:
	rm -rf build build-san-* build-clang build-fuzz
