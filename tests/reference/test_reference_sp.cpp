// Ulysses over two ranks against transformers (run under mpirun -np 2): sliding windows shorter
// than the sequence, packed rows (documents with restarting positions) and sinks (each rank's
// block of heads) give the loss and every gradient of the fixtures (make_fixtures.py) within
// 1e-5, with and without activation checkpointing. Each rank holds half of every row (slice_sequences; doc_start stays
// whole rows) and its own engine; the ranks' loss and gradient contributions are summed here.
#include <gtest/gtest.h>

#include <cstdio>

#include "parallel/communicator.h"
#include "so/data/batch_sampler.h"
#include "so/engine/engine.h"
#include "so/train/comm_sequence_parallel.h"
#include "tests/reference/reference_fixture.h"
#include "tests/test_util.h"

namespace so {
namespace {

std::vector<double> summed(Communicator& world, const std::vector<float>& mine) {
  std::vector<double> v(mine.begin(), mine.end());
  world.all_reduce_sum(v.data(), static_cast<int>(v.size()));
  return v;
}

double rel_error(const std::vector<double>& got, const std::vector<float>& want) {
  return test::rel_error(std::vector<float>(got.begin(), got.end()), want);
}

TEST(ReferenceSp2, WindowsAndPackedRowsMatchTransformers) {
  std::unique_ptr<Communicator> world = make_mpi_world_communicator();
  ASSERT_EQ(world->size(), 2) << "run under mpirun -np 2";
  std::unique_ptr<Communicator> self = world->split(world->rank(), 0, "self");
  auto backend = create_backend(test::cpu_backend_options());
  world->attach(*backend);
  self->attach(*backend);
  CommSequenceParallel ulysses(*world);  // the two-rank group, as the trainer builds it
  for (const char* name :
       {"mistral_window_short", "qwen2_sliding_layers", "llama_packed", "mistral_packed_window", "llama_sinks"})
    for (const bool ckpt : {false, true}) {
      SCOPED_TRACE(str_cat(name, ckpt ? " (activation checkpointing)" : ""));
      const Fixture fx = open_fixture(name);
      ModelOptions mo;
      mo.dtype = DType::F32;
      mo.micro_batch = fx.B;
      mo.seq_len = fx.S / 2;
      mo.activation_checkpointing = ckpt;
      mo.sequence_parallel = &ulysses;
      DecoderModel model(*backend, fx.cfg, mo);
      Engine engine(*backend, model.layout(), EngineOptions{}, *self);
      for (const std::string& p : fx.file.members("/weights")) {
        const int id = model.layout().find(p);
        ASSERT_GE(id, 0) << p;
        engine.load_weight(id, fx.file.read_f32("/weights/" + p, model.layout().params[id].shape));
      }
      const TokenBatch mine = slice_sequences(fixture_batch(fx), fx.S, 2, world->rank());
      engine.begin_step(0.0f);
      model.zero_loss();
      model.forward_backward(mine, engine, engine, 1.0f / static_cast<float>(fx.B * fx.S), true);
      const double loss = summed(*world, {model.read_loss()})[0];
      const double ref = fx.file.read_f32("/loss", {1})[0];
      EXPECT_LE(std::abs(loss - ref) / ref, 1e-5) << "loss " << loss << " vs torch " << ref;
      double worst = 0;
      for (const std::string& p : fx.file.members("/grads")) {
        const int id = model.layout().find(p);
        const double err = rel_error(summed(*world, engine.read_grad(id)),
                                     fx.file.read_f32("/grads/" + p, model.layout().params[id].shape));
        EXPECT_LE(err, 1e-5) << "gradient of " << p;
        worst = std::max(worst, err);
      }
      if (world->rank() == 0)
        std::printf("[%s%s, sp2] loss %.7f (torch %.7f, rel %.2e); worst gradient rel error %.2e\n", name,
                    ckpt ? " ckpt" : "", loss, ref, std::abs(loss - ref) / ref, worst);
    }
}

}  // namespace
}  // namespace so
