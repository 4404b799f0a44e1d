#pragma once
// so_bench's subcommands. Each lives in its own file as `int NAME_bench(int argc, char** argv,
// Communicator& comm)` (argv[0] is the subcommand's name) and has one row in so_bench_main.cpp's
// table; options are Boost.Program_options parsed by parse_command_line, so every subcommand
// answers -h the same way and rejects bad options the same way.
#include <boost/program_options.hpp>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace so::bench {

// Parses argv into vm against desc (which carries "help,h"). On -h prints the options and returns
// false (the subcommand then returns 0); a bad option throws so::Error naming it.
bool parse_command_line(const boost::program_options::options_description& desc, int argc, char** argv,
                        boost::program_options::variables_map& vm);

// "8", "64K", "64M", "1G": powers of 1024, as nccl-tests reads -b/-e; otherwise throws so::Error
// naming the option `what`.
int64_t parse_bytes(const std::string& s, const char* what);

// "1,2,8": positive integers; otherwise throws so::Error naming the option `what`.
std::vector<int64_t> parse_list(const std::string& s, const char* what);

// "fp32" or "bf16"; otherwise throws so::Error naming the option `what`.
DType parse_dtype(const std::string& s, const char* what);

int adam_bench(int argc, char** argv, Communicator& comm);
int step_bench(int argc, char** argv, Communicator& comm);
int ckpt_bench(int argc, char** argv, Communicator& comm);
int comm_bench(int argc, char** argv, Communicator& comm);
int link_bench(int argc, char** argv, Communicator& comm);
int gpu_peaks_bench(int argc, char** argv, Communicator& comm);  // gpu_bench.cpp
int ops_bench(int argc, char** argv, Communicator& comm);        // gpu_bench.cpp
int attention_bench(int argc, char** argv, Communicator& comm);  // attention_bench.cpp
int calibrate_bench(int argc, char** argv, Communicator& comm);

}  // namespace so::bench
