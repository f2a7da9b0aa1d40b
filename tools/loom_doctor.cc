// loom-doctor: tells why a Loom job hangs or failed.
//
//   loom-doctor analyze DIR        reads the ranks' dumps (LOOM_DUMP_DIR)
//   loom-doctor status [ADDR]      asks a live job (any rank's diag server,
//                                  LOOM_DIAG_ADDR; default 127.0.0.1:28950)
//                                  twice, --interval seconds apart, to tell
//                                  stuck from slow
//   loom-doctor show [ADDR]        one process's state as text
//
// The first line of the output is the verdict ("CLASS: sentence"); the
// evidence follows, one line per fact. Exit 0 with a verdict; 1 when there
// was nothing to judge (NO_DATA: no readable dump, an unreadable directory)
// or no verdict (NO_VERDICT), or a live job could not be queried; 2 on
// bad usage.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "diag/analyze.h"
#include "diag/hub.h"

namespace {

void usage(FILE* out) {
  fprintf(out,
          "usage: loom-doctor analyze DIR [--json]\n"
          "       loom-doctor status [ADDR] [--interval SECONDS] [--json]\n"
          "       loom-doctor show [ADDR]\n"
          "  analyze: verdict from the JSON dumps the ranks wrote to LOOM_DUMP_DIR\n"
          "  status:  verdict from a live job: gathers every rank's state through the diag\n"
          "           server at ADDR (default 127.0.0.1:28950, see LOOM_DIAG_ADDR), twice\n"
          "           --interval seconds apart (default 3) to tell stuck from slow\n"
          "  show:    the state of the process serving ADDR, as text\n"
          "  exit: 0 with a verdict; 1 with nothing to judge (NO_DATA, NO_VERDICT) or a job\n"
          "        that did not answer; 2 on bad usage\n");
}

void print(const loom::diag::Verdict& v, bool as_json) {
  if (as_json) {
    nlohmann::json j{{"class", v.cls}, {"ranks", v.ranks}, {"summary", v.summary}, {"evidence", v.evidence}};
    printf("%s\n", j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    fputs(v.to_text().c_str(), stdout);
  }
}

loom::Result<loom::diag::Snapshot> gather(const std::string& addr) {
  auto text = loom::diag::query(addr, "gather", 8.0);
  if (!text.is_ok()) return text.status();
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return loom::internal_error("malformed answer from " + addr);
  return loom::diag::from_gather(j);
}

int bad_usage(const std::string& why) {
  fprintf(stderr, "loom-doctor: %s\n", why.c_str());
  usage(stderr);
  return 2;
}

// 0 with a verdict, 1 with nothing to judge.
int verdict_code(const loom::diag::Verdict& v) { return v.cls == "NO_DATA" || v.cls == "NO_VERDICT" ? 1 : 0; }

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    }
  if (argc < 2) return bad_usage("which command: analyze, status or show?");
  std::string cmd = argv[1];
  if (cmd != "analyze" && cmd != "status" && cmd != "show") return bad_usage("unknown command '" + cmd + "'");
  std::string arg;
  bool as_json = false;
  double interval = 3.0;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && cmd != "show") {
      as_json = true;
    } else if (a == "--interval" && cmd == "status") {
      // Regression: "--interval" without a value became the address, and
      // "--interval abc" 0 s.
      char* end = nullptr;
      if (i + 1 >= argc) return bad_usage("--interval needs a number of seconds");
      interval = strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || !(interval > 0 && interval <= 3600))
        return bad_usage(std::string("--interval '") + argv[i] + "': seconds, more than 0 and at most 3600");
    } else if (!a.empty() && a[0] == '-') {
      return bad_usage("'" + a + "' is not an option of " + cmd);
    } else if (arg.empty()) {
      arg = a;
    } else {
      return bad_usage("one " + std::string(cmd == "analyze" ? "directory" : "address") + " only ('" + arg +
                       "', then '" + a + "')");
    }
  }
  if (cmd == "analyze") {
    if (arg.empty()) return bad_usage("analyze needs the dump directory (LOOM_DUMP_DIR)");
    const loom::diag::Verdict v = loom::diag::analyze(loom::diag::load_dumps(arg));
    print(v, as_json);
    return verdict_code(v);
  }
  if (arg.empty()) arg = "127.0.0.1:28950";
  if (cmd == "show") {
    auto text = loom::diag::query(arg, "text", 5.0);
    if (!text.is_ok()) {
      fprintf(stderr, "loom-doctor: %s\n", text.status().to_string().c_str());
      return 1;
    }
    fputs(text->c_str(), stdout);
    return 0;
  }
  if (cmd == "status") {
    auto first = gather(arg);
    if (!first.is_ok()) {
      fprintf(stderr, "loom-doctor: cannot query %s: %s\n", arg.c_str(), first.status().to_string().c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(interval));
    auto second = gather(arg);
    if (!second.is_ok()) {
      // The job may have ended or failed in between: judge the first look.
      fprintf(stderr, "loom-doctor: second query failed (%s); judging the first snapshot\n",
              second.status().to_string().c_str());
      const loom::diag::Verdict v = loom::diag::analyze(*first);
      print(v, as_json);
      return verdict_code(v);
    }
    const loom::diag::Verdict v = loom::diag::analyze(*second, &*first);
    print(v, as_json);
    return verdict_code(v);
  }
  return bad_usage("unknown command '" + cmd + "'");
}
