/* Fuzz targets (host/fuzz): each file defines LLVMFuzzerTestOneInput. Built with clang's
 * libFuzzer by `make fuzz` (NH_FUZZ=ON); otherwise linked with fuzz_replay.c, which runs
 * the committed corpus and every crash kept so far through it, under ctest (and under
 * ASan + UBSan in the build-asan tree). */
#ifndef NH_FUZZ_H
#define NH_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as a NUL-terminated string (a copy; free it). */
char *nh_fuzz_cstr(const uint8_t *data, size_t size);

/* Lua targets (nh_fuzz_lua.c): loads `chunk` once (it defines the global function
 * `fn`), then calls fn(input); a Lua error out of fn aborts, which is a finding. */
void nh_fuzz_lua_run(const char *chunk, const char *fn, const uint8_t *data, size_t size);

#endif
