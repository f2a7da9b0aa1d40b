// In-memory schedule interpreter: executes the schedules of N virtual ranks
// without transports, with the exact matching rules of the executor
// (schedule.h). It checks what a real run could only show as corruption or a
// hang: unmatched or mismatched messages, intra-phase read/write hazards and
// deadlock (every rank blocked), each reported with the rank, phase and step.
#pragma once

#include <cstddef>
#include <vector>

#include "algorithms/schedule.h"

namespace loom {

// bufs[r][id] is rank r's base pointer for buffer id (kBufSend, kBufRecv,
// kBufUser+i); kBufScratch may be null: the interpreter allocates it, filled
// with 0x7f bytes (the executor's scratch holds an earlier op's data, so a
// step that reads scratch it never wrote must not see zeros).
// elems[r][id], when given, is the number of elements buffer id of rank r
// holds: every step's reference is checked against it (scratch always is).
Status interpret(const std::vector<RankSchedule>& schedules, std::vector<std::vector<std::byte*>> bufs, DataType dt,
                 RedOp op, const std::vector<std::vector<size_t>>& elems = {});

// Applies one local step (copy / reduce / divide) — shared with the executor.
void apply_local_step(const Step& s, std::byte* dst, const std::byte* src, const std::byte* src2, DataType dt, RedOp op,
                      int nranks);

}  // namespace loom
