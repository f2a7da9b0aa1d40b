/* Loom tuner plugin ABI, version 1.
 *
 * A tuner plugin is a shared library named by LOOM_TUNER_PLUGIN. It exports
 * one symbol, LOOM_TUNER_SYMBOL_V1 ("loom_tuner_plugin_v1"), a
 * loom_tuner_v1_t whose abi_version is LOOM_TUNER_ABI_VERSION_1 and whose
 * struct_size is at least sizeof(loom_tuner_v1_t) of this header.
 *
 * For every selection Loom first runs its own cost model, then passes the
 * candidates (names and predicted times) to choose(). The plugin may pick a
 * candidate by index and may set chunk size / channel count; -1 / 0 mean "no
 * opinion". A non-zero return from any function is an error: Loom logs it and
 * keeps its own choice. LOOM_ALGO, when it covers the call, wins over the
 * plugin. Plugins must not throw (C ABI) and must be thread-safe per context.
 *
 * Compatibility rule: version 1 never changes. Fields are only ever appended
 * in a new version with a new symbol name (loom_tuner_plugin_v2, ...).
 */
#ifndef LOOM_TUNER_V1_H_
#define LOOM_TUNER_V1_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_TUNER_ABI_VERSION_1 1u
#define LOOM_TUNER_SYMBOL_V1 "loom_tuner_plugin_v1"

/* Values equal loom::Collective (and ncclFunc order of loom/types.h). */
enum loom_tuner_collective_v1 {
  LOOM_TUNER_ALLREDUCE = 0,
  LOOM_TUNER_REDUCE_SCATTER = 1,
  LOOM_TUNER_ALL_GATHER = 2,
  LOOM_TUNER_BROADCAST = 3,
  LOOM_TUNER_REDUCE = 4,
  LOOM_TUNER_ALL_TO_ALL = 5,
  LOOM_TUNER_SENDRECV = 6
};

typedef struct loom_tuner_request_v1 {
  int collective;                     /* loom_tuner_collective_v1 */
  size_t bytes;                       /* message size, see docs/topology.md */
  int nranks;
  int nhosts;
  int num_candidates;
  const char* const* candidate_names; /* [num_candidates], e.g. "ring", "tree" */
  const double* predicted_us;         /* [num_candidates]; < 0 when the model has no estimate */
} loom_tuner_request_v1_t;

typedef struct loom_tuner_choice_v1 {
  int candidate;      /* index into candidate_names; -1 = keep Loom's choice */
  size_t chunk_bytes; /* 0 = keep */
  int channels;       /* 0 = keep */
} loom_tuner_choice_v1_t;

typedef struct loom_tuner_v1 {
  uint32_t abi_version; /* LOOM_TUNER_ABI_VERSION_1 */
  uint32_t struct_size; /* sizeof(loom_tuner_v1_t) */
  const char* name;     /* for logs */
  /* Called once per tuner instance; *context is passed back to the others. */
  int (*init)(void** context, int nranks, int nhosts);
  int (*choose)(void* context, const loom_tuner_request_v1_t* request, loom_tuner_choice_v1_t* choice);
  int (*finalize)(void* context);
} loom_tuner_v1_t;

#ifdef __cplusplus
}
#endif

#endif /* LOOM_TUNER_V1_H_ */
