// A constraint on the tokens a request may generate (structured outputs: a JSON schema, a regex, a grammar;
// implemented by server/grammar_constraint.hpp over grammar/). The engine drives it once per generated
// position, on the engine thread only:
//
//   constraint->fill_mask(words);   // before sampling: the ids allowed next (bit id % 32 of words[id / 32])
//   ... mask the logits (host: apply(); device: the same bitmask), sample, or take a forced id ...
//   constraint->accept(id);         // every emitted id, sampled or forced, stop ids included
//
// The mask already contains the request's stop ids exactly where the constraint may end, and only those
// once finished(). A mask with no bit set means nothing may follow: the engine ends the choice (kStop).
// rollback(n) undoes the last n accepted ids (speculative decoding rejects drafts).
#pragma once

#include <cstdint>
#include <limits>
#include <span>

namespace deltaflow::engine {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;

  // words.size() >= mask_words(vocab) = (vocab + 31) / 32; every bit is written (disallowed ids cleared).
  virtual void fill_mask(std::span<uint32_t> words) = 0;
  // Advances over an emitted id. False when the id breaks the constraint (a forced id, or a caller that did
  // not mask); the constraint is then unchanged and the caller should end the choice.
  virtual bool accept(int32_t id) = 0;
  // The constraint is complete: only a stop id may follow.
  virtual bool finished() const = 0;
  virtual void rollback(int n) = 0;

  static size_t mask_words(size_t vocab) { return (vocab + 31) / 32; }

  // Host helper: logits of ids whose bit is clear become -inf.
  static void apply_mask(std::span<const uint32_t> words, std::span<float> logits) {
    for (size_t i = 0; i < logits.size(); ++i)
      if (i / 32 >= words.size() || !((words[i / 32] >> (i % 32)) & 1u))
        logits[i] = -std::numeric_limits<float>::infinity();
  }
};

}  // namespace deltaflow::engine
