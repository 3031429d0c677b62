// The built-in corpus that make-model's tokenizers are trained on. Written for
// duet; edit freely, but every edit changes the merges of generated models.
#include <string_view>

#include "text/bpe_trainer.h"

namespace duet::text {
namespace {

constexpr char kCorpus[] = R"corpus(Serving a Language Model, One Token at a Time

A language model on its own is only a large pile of numbers. It becomes a service when a program accepts requests, turns their text into tokens, runs the model over those tokens, and sends the answer back while the user is still watching the screen. This note walks through that path from the socket to the GPU and back, and explains why each part is shaped the way it is.

The first step is tokenization. The tokenizer splits the prompt into words, and then splits each word into pieces that the model knows. A byte-level tokenizer never fails: any string of bytes can be written with its vocabulary, because the single bytes are always there. Common words become one token, rare words become several, and a strange name like Zyxwvut becomes many small pieces. The number of tokens matters, since the cost of a request grows with it.

Prefill and decode

Every request has two phases. In the prefill phase the model reads the whole prompt at once. All prompt tokens go through every layer together, so prefill is a large matrix multiplication that keeps the arithmetic units busy. A prompt of 2048 tokens on a 7B model takes on the order of 28 trillion floating point operations, and a modern accelerator finishes that in well under a second.

In the decode phase the model writes the answer one token at a time. Each step reads one new token, attends to everything that came before, and produces a probability for every entry in the vocabulary. The sampler picks the next token, and the loop runs again. Decode is small work repeated many times: for each step the weights must be read from memory, but only a little arithmetic is done with them. That is why decode is limited by memory bandwidth, not by compute, and why batching many requests together helps so much. When 64 requests share one step, the weights are read once and used 64 times.

The time to first token is mostly prefill. The time between tokens is mostly decode. A good server watches both numbers, because users notice both: a long wait before the first word feels broken, and a slow trickle of words afterwards feels tired.

The KV cache

Attention needs the keys and values of every earlier token. Computing them again at every step would repeat the prefill each time, so the server keeps them in the KV cache. For each layer and each token, the cache stores one key vector and one value vector per key-value head. The size adds up quickly. A model with 32 layers, 8 key-value heads and a head dimension of 128 stores 2 * 32 * 8 * 128 = 65536 numbers per token; in bfloat16 that is 128 KiB per token, so a context of 8192 tokens needs a full gigabyte.

Because memory is the scarce resource, the cache is managed like virtual memory. It is cut into fixed blocks, each holding the keys and values of, say, 16 tokens. A request owns a list of blocks, its block table, and the attention kernel follows the table to find the tokens it needs. Blocks do not have to be next to each other in memory. When a request finishes, its blocks go back to the free list at once, and a new request can take them without copying anything.

Blocks also make sharing cheap. Many requests start with the same system prompt. If the first blocks of two prompts hold the same tokens, they hold the same keys and values too, so the server can keep one copy and point both block tables at it. A hash of the tokens in a block, chained with the hash of the block before it, names the block; a new request looks up its hashes and skips the prefill of every block that is already there. This is prefix caching, and for chat workloads it often saves more than half of the prefill work.

When the cache is full, something has to give. The scheduler can refuse new requests, it can preempt a running request and free its blocks, or it can move blocks to host memory and bring them back later. Each choice trades latency for throughput in a different way, and the right one depends on how long the requests are and how patient the users are.

The scheduler

The scheduler runs once per step. It looks at the waiting queue and at the running batch, and decides what the next forward pass will contain. A simple policy is first come, first served, with a cap on the number of tokens per step. New requests join the batch as soon as there are blocks for their prompts; finished requests leave it at the end of the step that produced their last token. This is continuous batching: the batch is never drained and refilled as a whole, so the GPU never waits for the slowest request.

Long prompts are a problem for a mixed batch. A prompt of 32000 tokens would make one step take a long time, and every decode in the same batch would stall behind it. Chunked prefill splits the long prompt into pieces of, for example, 512 tokens and runs one piece per step next to the decodes. The prompt takes a little longer to finish, but the other users keep receiving their tokens at a steady pace.

Another approach separates the phases entirely. Prefill runs on one group of machines, decode on another, and the KV cache moves between them over the network. Disaggregation lets each group use the batch size and the parallelism that suit its phase. The price is the transfer: the keys and values of a long prompt can be hundreds of megabytes, and they must arrive before the first decode step can start. Fast links such as InfiniBand or NVLink, and transfers that overlap with the prefill of later layers, keep that price small.

Sampling

The model produces logits, one score per token of the vocabulary. Greedy decoding takes the largest one. Sampling with a temperature divides the logits by the temperature, turns them into probabilities with a softmax, and draws a token at random. Top-k keeps only the k most likely tokens; top-p keeps the smallest set whose probabilities add up to p. A fixed seed makes the draw repeatable, which matters a great deal for tests: a test that samples with seed 1234 must see the same tokens every time it runs.

Stop conditions end the loop. A request stops when it produces an end-of-sequence token, when it reaches its maximum number of new tokens, or when the generated text ends with one of its stop strings. Checking stop strings needs care, because a stop string can be split across two tokens, and the server must not send the first half to the user before it knows whether the second half follows.

Networking

Requests arrive over HTTP. The server parses the JSON body, checks every field, and answers a malformed request with a clear error instead of crashing. Streaming responses use server-sent events: each new piece of text is written as a small event, and the connection stays open until the last one. The network threads never block; they hand work to the engine through a queue and return to their sockets.

Between machines the server speaks a compact binary protocol. Every message carries a version number and a length, and the receiver validates both before it trusts anything else. A peer that disappears is reported as unavailable, a request that runs too long as a deadline exceeded, and a full cache as resource exhausted. Clear error codes let the caller decide whether to retry, to wait, or to give up.

Parallelism

A model too large for one device is split across several. Tensor parallelism cuts each weight matrix into slices and gives one slice to each device; after every layer the devices exchange partial results with an all-reduce. Pipeline parallelism gives whole layers to different devices and passes the activations along like a bucket brigade. Tensor parallelism needs fast links between the devices, since it talks after every layer; pipeline parallelism talks less but leaves bubbles where a stage waits for its input.

Expert models add a third kind. In a mixture of experts, each token visits only a few of the feed-forward experts, chosen by a small router. Expert parallelism spreads the experts over devices and sends each token to the devices that hold its experts, so the network carries the tokens themselves, twice per layer.

Measuring

Numbers keep a server honest. Throughput is tokens per second across all requests; latency is measured per request, at the median and at the 99th percentile. A benchmark that reports only the average hides the slow tail where the users complain. Good benchmarks fix the prompt lengths, the output lengths and the arrival rate, warm up before they measure, and compare against a reference measured on the same machine in the same run. A result such as 1830 tokens/s means little alone; next to the 2410 tokens/s of a peer, or the 2600 tokens/s that the memory bandwidth allows, it tells a story.

Memory bandwidth sets the ceiling for decode. An accelerator with 4.8 TB/s of bandwidth that must read 14 GB of weights per step can do at most about 340 steps per second for a single request, no matter how fast its arithmetic is. Batching raises the tokens per step, quantization shrinks the bytes per weight, and speculative decoding lets a small draft model guess several tokens that the large model then checks in one pass.

A short glossary

Attention: the operation that lets each token look at earlier tokens, weighted by how well its query matches their keys.
Batch: the set of sequences that share one forward pass.
Block: a fixed number of token slots in the KV cache.
Embedding: the table that turns a token id into a vector.
Head: one of the parallel attention computations in a layer; grouped-query attention shares each key-value head among several query heads.
Logit: an unnormalized score for one vocabulary entry.
Normalization: RMSNorm scales each vector by the inverse of its root mean square, times a learned weight.
Rotary embedding: RoPE rotates pairs of query and key dimensions by an angle that grows with the position, so that attention sees relative distances.
Sliding window: some models attend only to the last 4096 tokens, which bounds the cache.
Token: the unit the model reads and writes; about three quarters of an English word on average.

Some code

The engine loop, written out in a plain style, looks like this:

  while (!shutdown_requested) {
    Batch batch = scheduler.Schedule(waiting, running, free_blocks);
    if (batch.empty()) { WaitForWork(); continue; }
    Logits logits = model.Forward(batch.tokens, batch.positions, kv_cache);
    for (int i = 0; i < batch.size(); ++i) {
      int next = sampler.Sample(logits.row(i), batch.params[i]);
      batch.requests[i]->Append(next);
      if (batch.requests[i]->Finished()) scheduler.Release(batch.requests[i]);
    }
  }

A request as it arrives over the wire:

  POST /v1/chat/completions HTTP/1.1
  Content-Type: application/json

  {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello!"}],
   "max_tokens": 64, "temperature": 0.7, "top_p": 0.95, "stream": true}

And a few lines of Python that a user might write against it:

  import json, urllib.request
  body = json.dumps({"prompt": "The KV cache is", "max_tokens": 16}).encode()
  req = urllib.request.Request("http://localhost:8080/v1/completions", data=body)
  with urllib.request.urlopen(req) as resp:
      print(json.load(resp)["choices"][0]["text"])

The block table of a request is a list of integers such as [17, 4, 233, 90, 1024], and the slot of token t is block_table[t / 16] * 16 + t % 16. With a block size of 16 and 4096 blocks, the cache holds 65536 token slots. If each block takes 2 MiB, the whole cache takes 8 GiB, which leaves room on an 80 GB card for the weights of a 13B model in half precision.

Configuration lives in small files:

  [server]
  port = 8080
  max_batch_tokens = 8192
  max_num_seqs = 256
  block_size = 16
  gpu_memory_fraction = 0.90

  [model]
  path = /models/tiny
  dtype = bfloat16
  max_model_len = 4096

Logs are lines that a person can read at three in the morning:

  2024-05-17 03:12:45.118 INFO scheduler: step=48213 running=61 waiting=7 free_blocks=312
  2024-05-17 03:12:45.139 WARN kv_cache: preempted request 9f3a after 812 tokens
  2024-05-17 03:12:45.201 ERROR http: bad request from 10.0.4.21: missing field "messages"

Testing a server

Every part of the server can be tested without a GPU. The tokenizer is checked against known splits; the scheduler is driven by a fake clock and a fake model that returns fixed logits; the KV cache is checked by writing numbers into blocks and reading them back after the blocks have been freed and reused. Tests never sleep. When one thread must wait for another, it waits on an event that the other thread signals, so the test is as fast as the machine allows and fails the same way each time it fails.

The kernels are tested against a reference written in plain C++ on the CPU. Each kernel runs on random inputs with a fixed seed, and the test compares the result to the reference with a tolerance that suits the data type: tight for float32, looser for bfloat16, where only eight bits of mantissa survive. A kernel that is fast but wrong is worse than no kernel at all.

A note on words from other languages

Users write in many languages, and a tokenizer trained only on English still has to handle them. A request might ask about a café in Zürich, a naïve résumé, the façade of a château, a jalapeño recipe, or the word déjà vu. It might greet the server with señor, merci, danke schön, or grüß Gott, and sign off with adiós. Byte-level tokens cover all of these: an accented letter such as é is two bytes in UTF-8, and the tokenizer can always fall back to them, even when it has never seen the word. The price is length: a sentence in a language far from the training text can take three or four times as many tokens as the same sentence in English.

Why the details matter

Most of the time spent building a server goes into details that the user never sees. The user sees the first token arrive after 180 milliseconds, and the rest follow at 45 tokens per second; they do not see the block allocator, the prefix hashes, the chunked prefill or the all-reduce. But each of those details decides a few milliseconds, and together they decide whether the service feels instant or sluggish, whether it serves 20 users per GPU or 200, and whether it falls over at the busiest hour of the day or keeps answering.

A server should fail loudly and recover quietly. When a worker crashes, its requests are retried on another worker, and the user sees a short pause instead of an error. When the cache runs out, the longest request is preempted, not the newest, because the newest has used the least and would lose the least by waiting, but the longest frees the most. When a client disconnects, the server cancels its request at the next step and returns the blocks, so that nobody pays for tokens that nobody will read.

Questions people ask

How many users can one GPU serve? It depends on the model, the prompt lengths and the output lengths, but a small model on a large card can keep hundreds of conversations going at once. Why is the first token slow when the prompt is long? Because prefill has to read every prompt token through every layer before the first answer token exists. Why does the answer change when the temperature is zero? It should not; if it does, two requests in the same batch may be adding their numbers in a different order, and floating point addition is not associative. Can the cache be shared between users? Only for identical prefixes, and only when the server is sure that nothing private leaks from one user to another.

What does a small model cost to run? A model of 1B parameters in bfloat16 needs 2 GB for its weights, so it fits on almost any accelerator, and its decode steps are fast because there is little to read. A model of 70B parameters needs 140 GB, more than one card holds, so it is split across two, four or eight devices, and the links between them become part of every step.

Numbers worth remembering

  1 token           ~ 4 characters of English text
  1 KiB             = 1024 bytes
  1 GB/s            = 10^9 bytes per second
  bfloat16          = 2 bytes, 8 bits of exponent, 7 bits of mantissa
  float32           = 4 bytes
  int8              = 1 byte
  128 KiB per token for a 7B model with grouped-query attention
  0.5 ms            a round trip inside one data center
  3.2 TB/s          the memory bandwidth of a large accelerator
  900 GB/s          the NVLink bandwidth between two such devices

The life of one request

Follow a single request through the system. A user types a question and presses enter. The browser opens a connection to the gateway, which picks a server with spare capacity and forwards the request. The server reads the body, checks that the model name is one it serves, that max_tokens is positive and not absurd, and that the messages are a list of objects with a role and some content. Then it applies the chat template, which wraps each message in the markers the model was trained with, and hands the resulting text to the tokenizer.

The tokenizer returns 412 token ids. The server asks the block manager how many of the first blocks are already cached; the system prompt is shared with thousands of other conversations, so the first 20 blocks are found and pinned. Only the last 92 tokens need prefill. The request enters the waiting queue with its block table partly filled.

At the next step the scheduler sees free room in the token budget and admits the request. The forward pass computes the keys and values of the 92 new tokens, writes them into two fresh blocks, and returns the logits of the last position. The sampler draws the first answer token, and the server sends it to the user as the first event of the stream, 95 milliseconds after the request arrived.

From then on the request is part of the decode batch. Each step adds one token to its cache and one word or word piece to its answer. After 230 steps the model writes the end-of-turn token. The server sends the final event with the usage counts, 412 prompt tokens and 230 completion tokens, closes the stream, and releases the blocks. The shared prefix blocks stay in the cache, with their reference counts lowered by one, ready for the next conversation that begins the same way.

Quantization

Weights stored in 16 bits can often be stored in 8 or even 4 bits with little loss. Each group of, for example, 128 weights shares one scale, and every weight in the group is kept as a small integer that is multiplied by the scale when it is used. Decode reads fewer bytes per step, so it runs faster; the model also fits on fewer devices. The cost is some accuracy, and kernels that unpack the integers on the fly without wasting the time they saved.

The KV cache can be quantized too. Keys and values in 8-bit floating point halve the memory per token, which doubles the number of tokens that fit, which in turn lets the scheduler run larger batches. Whether the answers stay good enough is a question for careful evaluation, not for intuition.

Speculative decoding

A small draft model is cheap to run. It guesses the next four or five tokens, one after another, and the large model then checks all of the guesses in a single forward pass, the way it would process a short prompt. Every guess that matches what the large model would have chosen is accepted; at the first mismatch the large model's own token is taken and the rest are thrown away. When the draft is right most of the time, the large model produces several tokens per pass instead of one. The output is exactly what the large model alone would have produced, because every accepted token is one it agreed with.

The draft does not have to be a separate model. Some systems add extra heads to the large model that predict tokens further ahead; others look for the guess in the prompt itself, since answers often repeat phrases from the question. Each method is a bet that the next few tokens are easy to predict, and the bet pays off most on code, on structured output, and on answers that quote their input.

Load balancing

A cluster runs many copies of the server. The gateway in front of them decides where each request goes. Round robin is simple but blind: it sends a long request to a busy server as readily as to an idle one. Better policies look at the queue length of each server, or at the number of free KV blocks, or at which server already holds the prefix of this conversation in its cache. Sending a returning user to the server that remembers their history can save most of the prefill, but sending everyone to the same server overloads it; a good policy balances locality against load.

Health checks keep the gateway honest. A server that stops answering its health endpoint is taken out of rotation, its in-flight requests are retried elsewhere, and it rejoins only after it has answered several checks in a row. Draining a server for an upgrade works the same way: it stops accepting new requests, finishes the ones it has, and then restarts.

Observability

When something goes wrong at scale, the only witnesses are the metrics and the logs. A server exports counters and histograms: requests started and finished, tokens in and out, time to first token, time per output token, queue length, cache usage, preemptions per minute. A dashboard that plots these over time shows at a glance whether a slowdown comes from more traffic, from longer prompts, or from a sick machine.

Traces follow a single request across components. The gateway starts a span, the server adds spans for tokenization, queueing, prefill and decode, and the transfer of the KV cache between machines gets its own span with its size in bytes. When a user reports that a reply took 14 seconds, the trace shows whether those seconds were spent waiting in the queue, stuck behind a long prefill, or moving data across a slow link.

A debugging story

One morning the p99 latency of a cluster doubled while the median stayed flat. Nothing had been deployed. The traces showed that the slow requests all spent their extra time in decode, and that they were all on the same four machines. Those machines reported normal GPU utilization, normal memory, normal temperature. The logs, read carefully, showed one odd line every few minutes: a warning that an all-reduce had taken 40 milliseconds instead of the usual 2.

The four machines shared a network switch. A firmware update on that switch, applied overnight by another team, had changed a buffer setting, and under bursty traffic it dropped packets. The collective library retried, the retries took time, and every step of every request on those machines waited for the slowest all-reduce. Rolling back the firmware fixed the tail within minutes. The lesson was not about switches; it was that the tail hides problems the median cannot see, and that the logs must record the odd event even when everything else looks fine.

Fairness and priorities

Not all requests are equal. An interactive chat needs its first token quickly; a batch job that summarizes ten thousand documents overnight cares only about total throughput. A scheduler with priorities lets the chat requests jump the queue while the batch job fills the gaps. Fairness between users matters as well: one client that sends a thousand requests at once should not starve everyone else, so the server can cap the share of the batch that any one client occupies, or charge each client by the tokens it consumes and serve the one with the smallest bill first.

Deadlines add another dimension. A request that will not finish before its deadline is better rejected early than served late, because a late answer is wasted work that also delayed everyone else. Estimating whether a request can meet its deadline needs a model of the server's own speed, which the server can learn from its recent steps.

Memory on the host

A GPU has tens of gigabytes of memory, but the machine around it often has hundreds. Blocks that belong to idle conversations can be moved to host memory and moved back when the user returns. The copy runs over PCIe at perhaps 25 GB/s, much slower than the GPU's own memory but much faster than recomputing a long prefill. A second tier on local disk can hold even more, for conversations that might return tomorrow. Each tier is a cache for the one above it, and the same questions apply at every level: what to keep, what to evict, and when to fetch ahead of need.

Startup

A server must load its weights before it can answer anything. Reading 140 GB from a network file system at 2 GB/s takes more than a minute, so large deployments keep the weights on local disks, read them with many threads in parallel, and map the files directly into memory where they can. The safetensors format helps: a small JSON header lists every tensor with its type, shape and byte range, and the rest of the file is raw data that can be copied to the device without parsing. After loading, the server runs a few warm-up steps so that kernels are compiled and memory pools are filled before the first real user arrives.

Closing

A serving system is a small operating system for one very large program. It schedules work, manages memory, moves data between machines, and reports what went wrong. The ideas are old: paging, batching, queues, caches. What is new is the scale of the data and the price of every wasted byte. The best servers are the ones whose authors measured first, wrote the simplest thing that could work, and then measured again.

It's easy to forget that the model itself doesn't know any of this. It reads tokens and writes tokens; we'll keep the machinery around it fast, fair, and correct, and we've learned that every layer of that machinery must be tested on its own. They're simple rules, and you'd be surprised how often they're broken. I'm sure the next version will break a few more, and we'd better write the tests before it does.
)corpus";

}  // namespace

std::string_view TrainingCorpus() {
  return std::string_view(kCorpus, sizeof(kCorpus) - 1);
}

}  // namespace duet::text
