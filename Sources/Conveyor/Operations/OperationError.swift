/// Why a typed operation produced no value: its work failed, or it was cancelled first.
///
/// `AsyncOperation.value`, `AsyncOperation.run()` and the `SyncOperation` equivalents throw this
/// error. Cancellation is a case of its own, never a `Failure`, so a `Failure` type needs no
/// "cancelled" case and `Never`-failing operations can still report cancellation.
///
/// ```swift
/// do {
///   let page = try await operation.run()
///   print(page)
/// } catch .failed(let error) {
///   print("failed:", error)
/// } catch .cancelled {
///   print("cancelled")
/// }
/// ```
public enum OperationError<Failure: Error>: Error {
  /// The operation finished by throwing `Failure`.
  case failed(Failure)
  /// The operation was cancelled before it finished; its work's result, if any, was discarded.
  case cancelled
}

extension OperationError: Equatable where Failure: Equatable {}

extension OperationError: CustomStringConvertible {
  /// `cancelled`, or `failed: ` followed by the operation's error.
  public var description: String {
    switch self {
    case .failed(let error): "failed: \(error)"
    case .cancelled: "cancelled"
    }
  }
}
