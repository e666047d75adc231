# tandem build. One `make`; `make test`; `make run`; `make SAN=1 test`; `make format-check`.
# Sources are found by folder (one concern per file), so adding a .c file needs no edit here.
#
#   common/base common/gguf common/tok      -> libtcore.a  (router links only this + net)
#   common/model kernels/cpu                -> libtmodel.a
#   common/net + generated proto/           -> libtnet.a
#   kernels/cuda/*.cu                       -> libtcuda.a  (CUDA=1, or auto when nvcc is found)
#   cli/ router/ prefill/ decode/           -> build/tandem, build/tandem-{router,prefill,decode}
#   tests/unit/test_*.c tests/ops/test_*.c tests/model/test_*.c -> build/tests/<name>

BUILD   ?= build
# the sanitizer build has its own folder; set before anything derives paths from BUILD
ifeq ($(SAN),1)
BUILD   := build-san
endif
CC      ?= cc
SAN     ?= 0
NATIVE  ?= 0
V       ?= 0

Q := $(if $(filter 1,$(V)),,@)

CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 \
           -Wno-unused-parameter
OPT     := -O2 -g
ARCHF   := -mavx2 -mfma -mf16c
ifeq ($(NATIVE),1)
ARCHF   := -march=native
endif
INC     := -I. -I$(BUILD)/gen -I/usr/share/include/llhttp
PKGS    := libuv jansson libpcre2-8 libprotobuf-c libutf8proc ucx
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
SYSTEMD_LIBS := $(shell pkg-config --libs libsystemd 2>/dev/null)

CFLAGS  += $(CSTD) $(OPT) $(WARN) $(ARCHF) $(INC) $(PKG_CFLAGS) -pthread -MMD -MP
LDLIBS  += $(PKG_LIBS) $(SYSTEMD_LIBS) -lm -lpthread -ldl

SANF    :=
ifeq ($(SAN),1)
SANF    := -fsanitize=address,undefined
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

# ---- CUDA (optional) --------------------------------------------------------------------------
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(origin CUDA),undefined)
CUDA    := $(if $(NVCC),1,0)
endif
# Full multi-target build by default; CI sets CUDA_ARCHS=90 to keep a 2-core compile short.
CUDA_ARCHS ?= 90 100 120
NVCCFLAGS  := -std=c++17 -O3 -g -lineinfo -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -Werror all-warnings \
              $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) -I. -MMD -MP
CUDA_HOME  := $(patsubst %/bin/nvcc,%,$(or $(realpath $(NVCC)),$(NVCC)))
ifeq ($(SAN),1)
CUDA    := 0
endif
# Where the CUDA runtime and cuBLAS live differs between toolkit layouts (lib64, lib,
# targets/<triple>/lib, Debian's multiarch dir): ask nvcc for its library path and search those.
# nvcc without the libraries (a compile-only toolkit) still compiles every .cu file as a check,
# but the binaries are linked without the CUDA backend, and the build says so once.
comma := ,
CUDA_LINK := 0
ifeq ($(CUDA),1)
CUDA_LIBDIRS := $(sort $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib $(CUDA_HOME)/targets/*/lib \
                  /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu) \
                  $(patsubst -L%,%,$(subst ",,$(shell $(NVCC) -dryrun -x cu -c /dev/null -o /dev/null 2>&1 | \
                  sed -n 's/^#[$$] LIBRARIES=//p'))))
CUDART_LIB := $(firstword $(wildcard $(addsuffix /libcudart_static.a,$(CUDA_LIBDIRS))))
CUBLAS_DIR := $(patsubst %/,%,$(dir $(firstword $(wildcard $(addsuffix /libcublas.so,$(CUDA_LIBDIRS))))))
ifneq ($(and $(CUDART_LIB),$(CUBLAS_DIR)),)
CUDA_LINK := 1
else
$(info NOTE: nvcc found ($(NVCC)) but not libcudart_static.a + libcublas.so in: $(CUDA_LIBDIRS))
$(info NOTE: compiling the CUDA code as a check only; binaries are built without the CUDA backend)
endif
endif

# ---- sources ------------------------------------------------------------------------------------
CORE_SRC  := $(wildcard common/base/*.c common/gguf/*.c common/tok/*.c) kernels/cpu/ktype.c
# ktype.c (type sizes) lives in libtcore: the GGUF reader validates tensor sizes with it, and the
# router links libtcore without the model library.
MODEL_SRC := $(filter-out kernels/cpu/ktype.c,$(wildcard common/model/*.c kernels/cpu/*.c))
NET_SRC   := $(wildcard common/net/*.c)
PROTO_SRC := $(wildcard proto/*.proto)
PROTO_GEN := $(patsubst proto/%.proto,$(BUILD)/gen/proto/%.pb-c.c,$(PROTO_SRC))
CUDA_SRC  := $(wildcard kernels/cuda/*.cu)
LLHTTP_SRC := $(wildcard /usr/share/llhttp/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

CORE_OBJ  := $(call obj,$(CORE_SRC))
MODEL_OBJ := $(call obj,$(MODEL_SRC))
NET_OBJ   := $(call obj,$(NET_SRC)) $(patsubst %.c,%.o,$(PROTO_GEN))
LLHTTP_OBJ := $(patsubst /usr/share/llhttp/%.c,$(BUILD)/obj/llhttp/%.o,$(LLHTTP_SRC))
CUDA_OBJ  := $(patsubst %.cu,$(BUILD)/obj/%.o,$(CUDA_SRC))

LIBCORE  := $(BUILD)/libtcore.a
LIBMODEL := $(BUILD)/libtmodel.a
LIBNET   := $(BUILD)/libtnet.a
LIBCUDA  := $(if $(filter 1,$(CUDA_LINK)),$(if $(CUDA_OBJ),$(BUILD)/libtcuda.a))
CUDA_LIBS := $(if $(LIBCUDA),$(CUDART_LIB) -L$(CUBLAS_DIR) -Wl$(comma)-rpath$(comma)$(CUBLAS_DIR) -lcublas -ldl -lrt -lstdc++)
ifeq ($(CUDA_LINK),1)
CFLAGS   += -DTANDEM_CUDA=1
endif
# compile-only check of the CUDA code when it cannot be linked
CUDA_CHECK := $(if $(filter 1,$(CUDA)),$(if $(filter 0,$(CUDA_LINK)),$(BUILD)/libtcuda.a \
                $(patsubst %.cu,$(BUILD)/obj/%.o,$(wildcard bench/bench_cuda_*.cu))))

CLI_SRC    := $(wildcard cli/*.c)
ROUTER_SRC := $(wildcard router/*.c)
PREFILL_SRC := $(wildcard prefill/*.c)
DECODE_SRC := $(wildcard decode/*.c)

BINS := $(BUILD)/tandem
ifneq ($(ROUTER_SRC),)
BINS += $(BUILD)/tandem-router
endif
ifneq ($(PREFILL_SRC),)
BINS += $(BUILD)/tandem-prefill
endif
ifneq ($(DECODE_SRC),)
BINS += $(BUILD)/tandem-decode
endif

TEST_SRC  := $(wildcard tests/unit/test_*.c tests/model/test_*.c tests/ops/test_*.c)
TEST_BINS := $(patsubst %.c,$(BUILD)/tests/%,$(notdir $(TEST_SRC)))
# C++ unit tests: CUDA device code compiled for the host (tests/unit/test_quant_piece.cc)
TEST_CXX_SRC := $(wildcard tests/unit/test_*.cc)
TEST_BINS += $(patsubst %.cc,$(BUILD)/tests/%,$(notdir $(TEST_CXX_SRC)))
FUZZ_SRC  := $(wildcard tests/fuzz/fuzz_*.c)
BENCH_SRC := $(wildcard bench/bench_*.c)
BENCH_BINS := $(patsubst %.c,$(BUILD)/bench/%,$(notdir $(BENCH_SRC)))
# CUDA benchmarks (bench/bench_cuda_*.cu, nvcc) exist only in CUDA builds
ifeq ($(CUDA_LINK),1)
BENCH_BINS += $(patsubst %.cu,$(BUILD)/bench/%,$(notdir $(wildcard bench/bench_cuda_*.cu)))
endif

# router/ minus main.c is also an archive so the unit tests can link the router's modules
ROUTER_LIB_SRC := $(filter-out router/main.c,$(ROUTER_SRC))
LIBROUTER := $(if $(ROUTER_LIB_SRC),$(BUILD)/librouter.a)

# libtcuda uses the type table in libtmodel, so it links first
ALL_LIBS := $(LIBROUTER) $(LIBCUDA) $(LIBMODEL) $(LIBCUDA) $(LIBNET) $(LIBCORE)

.PHONY: all test test-gpu run format format-check clean bench fuzz
all: $(BINS) $(TEST_BINS) $(BENCH_BINS) $(CUDA_CHECK)

# ---- rules --------------------------------------------------------------------------------------
$(BUILD)/obj/%.o: %.c | $(PROTO_GEN)
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

CXX      ?= g++
CXXFLAGS := -std=c++17 $(OPT) -Wall -Wextra -Werror -Wno-unused-parameter -Wno-unused-function -Wno-unknown-pragmas $(ARCHF) \
            $(INC) -fno-exceptions -fno-rtti -fno-strict-aliasing $(SANF) -MMD -MP
$(BUILD)/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	@echo "  CXX   $<"
	$(Q)$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/obj/llhttp/%.o: /usr/share/llhttp/%.c
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) -std=c11 -O2 -g -I/usr/share/include/llhttp -fPIC $(SANF) -c $< -o $@

$(BUILD)/gen/proto/%.pb-c.c $(BUILD)/gen/proto/%.pb-c.h: proto/%.proto
	@mkdir -p $(BUILD)/gen/proto
	@echo "  PROTOC $<"
	$(Q)protoc-c --c_out=$(BUILD)/gen $<

$(BUILD)/gen/proto/%.pb-c.o: $(BUILD)/gen/proto/%.pb-c.c
	@echo "  CC    $<"
	$(Q)$(CC) -std=c11 -O2 -g $(INC) $(PKG_CFLAGS) $(SANF) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC  $<"
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(LIBCORE): $(CORE_OBJ)
	$(Q)rm -f $@ && ar rcs $@ $^
$(LIBMODEL): $(MODEL_OBJ)
	$(Q)rm -f $@ && ar rcs $@ $^
$(LIBNET): $(NET_OBJ) $(LLHTTP_OBJ)
	$(Q)rm -f $@ && ar rcs $@ $^
$(BUILD)/librouter.a: $(call obj,$(ROUTER_LIB_SRC))
	$(Q)rm -f $@ && ar rcs $@ $^
$(BUILD)/libtcuda.a: $(CUDA_OBJ)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/tandem: $(call obj,$(CLI_SRC)) $(ALL_LIBS)
	@echo "  LD    $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(call obj,$(CLI_SRC)) $(ALL_LIBS) $(CUDA_LIBS) $(LDLIBS)
$(BUILD)/tandem-router: $(call obj,router/main.c) $(LIBROUTER) $(LIBNET) $(LIBCORE)
	@echo "  LD    $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(call obj,router/main.c) $(LIBROUTER) $(LIBNET) $(LIBCORE) $(LDLIBS)
$(BUILD)/tandem-prefill: $(call obj,$(PREFILL_SRC)) $(ALL_LIBS)
	@echo "  LD    $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(call obj,$(PREFILL_SRC)) $(ALL_LIBS) $(CUDA_LIBS) $(LDLIBS)
$(BUILD)/tandem-decode: $(call obj,$(DECODE_SRC)) $(ALL_LIBS)
	@echo "  LD    $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(call obj,$(DECODE_SRC)) $(ALL_LIBS) $(CUDA_LIBS) $(LDLIBS)

# the C++ tests link with the C++ driver (the unit emulations use std::vector)
$(patsubst %.cc,$(BUILD)/tests/%,$(notdir $(TEST_CXX_SRC))): $(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(Q)$(CXX) $(LDFLAGS) -o $@ $< $(ALL_LIBS) $(CUDA_LIBS) $(LDLIBS)
$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(ALL_LIBS) $(CUDA_LIBS) $(LDLIBS)
$(BUILD)/tests/%: $(BUILD)/obj/tests/model/%.o $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(ALL_LIBS) $(CUDA_LIBS) $(LDLIBS)
$(BUILD)/tests/%: $(BUILD)/obj/tests/ops/%.o $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(ALL_LIBS) $(CUDA_LIBS) $(LDLIBS)
$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(ALL_LIBS) $(CUDA_LIBS) $(LDLIBS)

# ---- running ------------------------------------------------------------------------------------
test: all
	$(Q)BUILD=$(BUILD) CUDA=$(CUDA_LINK) SAN=$(SAN) tests/run.sh

# GPU stages only (on a machine with a GPU): the ops tests and GPU model tests.
test-gpu: all
	$(Q)BUILD=$(BUILD) CUDA=$(CUDA_LINK) TANDEM_GPU_TESTS=1 tests/run.sh gpu

run: all
	$(Q)BUILD=$(BUILD) scripts/run-local.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
format-check:
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf build build-san

.SECONDARY:
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
