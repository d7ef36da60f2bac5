import Foundation

#if canImport(Glibc)
  import Glibc

  /// Lets the operation `make` returns wait for a dependency, cancels it on a queue (which then
  /// finishes it at once), frees it while the dependency is still pending, fills the freed memory
  /// with bytes that are no valid pointer, and only then finishes the dependency.
  ///
  /// Foundation on Linux keeps an operation's dependents unretained and reads them when it
  /// finishes: had the freed operation stayed on the dependency's books, finishing the dependency
  /// would crash the process (signal 11 in `Operation.observeValue`), as it did before the drop-in
  /// classes took themselves off those books when freed. glibc hands a freed block back first to
  /// the next request of its size on the same thread, so the filled blocks cover it; everything
  /// from the free to the dependency's finish runs on the calling thread.
  ///
  /// - Parameter make: Makes the dependent operation.
  /// - Returns: Whether the operation was freed here (so the check took place).
  public func finishDependencyAfterFreeingItsCancelledDependent(_ make: () -> Operation) -> Bool {
    let dependency = BlockOperation {}
    var dependent: Operation? = make()
    dependent?.addDependency(dependency)
    let queue = OperationQueue()
    queue.addOperation(dependent!)
    dependent?.cancel()
    dependent?.waitUntilFinished()
    // The queue lets go of the operation just after it finished: wait until this reference is
    // the last one, so that the operation is freed on this thread.
    let deadline = Date().addingTimeInterval(10)
    while !isKnownUniquelyReferenced(&dependent), Date() < deadline { usleep(1000) }
    guard isKnownUniquelyReferenced(&dependent), let size = dependent.flatMap(allocatedSize(of:)) else {
      return false
    }
    dependent = nil  // freed here, on this thread (no other reference is left, not even in a binding)
    var blocks: [UnsafeMutableRawPointer] = []
    blocks.reserveCapacity(16)
    for _ in 0..<16 {
      guard let block = malloc(size) else { break }
      memset(block, 0xFF, size)
      blocks.append(block)
    }
    dependency.start()
    for block in blocks { free(block) }
    return true
  }

  /// How many bytes malloc gave `object`; nil if that cannot be told.
  private func allocatedSize(of object: AnyObject) -> Int? {
    // malloc.h is not in the Glibc module: look `malloc_usable_size` up.
    typealias UsableSize = @convention(c) (UnsafeMutableRawPointer?) -> Int
    guard let symbol = dlsym(nil, "malloc_usable_size") else { return nil }
    return unsafeBitCast(symbol, to: UsableSize.self)(Unmanaged.passUnretained(object).toOpaque())
  }
#endif
