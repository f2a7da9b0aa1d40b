/* Example Loom tuner plugin (ABI v1).
 *
 * Policy, chosen to be easy to observe in tests and with loom-topo:
 *   - allreduce below 32 KiB: pick "tree" if it is a candidate;
 *   - all other calls: no opinion on the algorithm;
 *   - always ask for exactly 2 channels.
 * It counts its calls so a test can see it was consulted.
 */
#include <stdlib.h>
#include <string.h>

#include "../loom_tuner_v1.h"

typedef struct {
  int nranks;
  long calls;
} example_ctx;

static int example_init(void** context, int nranks, int nhosts) {
  (void)nhosts;
  example_ctx* c = (example_ctx*)calloc(1, sizeof(example_ctx));
  if (c == NULL) return 1;
  c->nranks = nranks;
  *context = c;
  return 0;
}

static int example_choose(void* context, const loom_tuner_request_v1_t* req, loom_tuner_choice_v1_t* out) {
  example_ctx* c = (example_ctx*)context;
  if (c == NULL || req == NULL || out == NULL) return 1;
  c->calls++;
  out->candidate = -1;
  out->chunk_bytes = 0;
  out->channels = 2;
  if (req->collective == LOOM_TUNER_ALLREDUCE && req->bytes < 32 * 1024) {
    for (int i = 0; i < req->num_candidates; ++i) {
      if (strcmp(req->candidate_names[i], "tree") == 0) out->candidate = i;
    }
  }
  return 0;
}

static int example_finalize(void* context) {
  free(context);
  return 0;
}

/* The one exported symbol. */
__attribute__((visibility("default"))) const loom_tuner_v1_t loom_tuner_plugin_v1 = {
    LOOM_TUNER_ABI_VERSION_1, sizeof(loom_tuner_v1_t), "example", example_init, example_choose, example_finalize};
