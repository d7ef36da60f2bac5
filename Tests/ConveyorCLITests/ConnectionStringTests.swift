import ConveyorPostgres
import Foundation
import Testing

@testable import conveyor

/// Connection strings read as libpq reads them: which are taken, what is wrong with the others
/// (never showing a word that may be part of a password), where a password is, and what
/// scrubbing leaves of one.
@Suite struct ConnectionStringTests {
  /// libpq's own parser decides: an escaped space, a quoted value with `\'`, and any keyword this
  /// libpq lists (`PQconndefaults`) are taken.
  @Test func stringsLibpqTakesAreTaken() throws {
    for text in [
      #"host=db password=SECRET\ PW-TAIL dbname=app"#, #"host=db password='it\'s a secret' dbname=app"#,
      "host = db dbname=app", "host=db " + LibPQConnectionString.keywords.sorted().map { "\($0)=1" }[0],
    ] {
      #expect(try DatabaseLocation(text) == .postgres(text), "\(text)")
    }
    #expect(LibPQConnectionString.keywords.isSuperset(of: ["host", "port", "dbname", "user", "password"]))
  }

  /// Each problem as libpq meets it, in its order; a word right after a password's value is never
  /// named, whether it has an `=` or not.
  @Test func whatIsWrongIsSaidWithoutShowingAPassword() {
    let keywords = LibPQConnectionString.keywords
    let cases: [(String, DatabaseLocation.ConninfoProblem)] = [
      ("host=db password=SECRET PW-TAIL", .wordAfterSecret(keyword: "password", isPair: false)),
      ("host=db password=SECRET PW-TAIL=x", .wordAfterSecret(keyword: "password", isPair: true)),
      ("sslpassword=SECRET PW-TAIL", .wordAfterSecret(keyword: "sslpassword", isPair: false)),
      ("host=db dbnme=app", .unknownKeyword("dbnme")),
      ("host=db dbname", .missingEquals(word: "dbname")),
      ("host=db password='SECRET", .unterminatedQuote),
      (#"host=db password='SECRET\' PW-TAIL"#, .unterminatedQuote),
      (#"password=SECRET\ PW-TAIL bogus=1"#, .wordAfterSecret(keyword: "password", isPair: true)),
      (#"password=SECRET\ PW-TAIL host=db bogus=1"#, .unknownKeyword("bogus")),
      ("host=db", .other),
    ]
    for (text, problem) in cases {
      let found = DatabaseLocation.conninfoProblem(in: text, keywords: keywords)
      #expect(found == problem, "\(text)")
      #expect(!found.explanation.contains("PW-TAIL") && !found.explanation.contains("SECRET"), "\(text)")
    }
  }

  /// A password is found where libpq finds one, however it is spelt; none where there is none.
  @Test func aPasswordIsFoundWhereLibpqFindsOne() {
    for text in [
      "postgresql://alice:SECRET PW@127.0.0.1:1/app", "postgresql://alice@h/app?pass%77ord=SECRET",
      "POSTGRES://alice:SECRET@h/app", "postgres://h/app?sslpassword=SECRET", #"host=h password=a\ b"#,
      "host=h password = 'a b'",
    ] {
      #expect(DatabaseLocation.holdsPassword(text), "\(text)")
    }
    for text in [
      "postgresql://alice@h/app", "postgresql://alice:@h/app", "host=h password=", "host=h passfile=/x",
      "jobs.sqlite",
    ] {
      #expect(!DatabaseLocation.holdsPassword(text), "\(text)")
    }
  }

  /// Scrubbing reads values as libpq does: a backslash keeps the next character in the value, a
  /// URL's password runs to its `@` spaces and all, a parameter's name is percent-decoded.
  @Test func scrubbingMasksPasswordsInEveryLibpqSpelling() {
    for text in [
      #"host=db password=SECRET\ PW-TAIL dbname=app"#, "postgresql://alice:SECRET PW-TAIL@h:1/app",
      "postgresql://alice@h/app?pass%77ord=SECRET-PW-TAIL&x=1", "x PaSsWoRd = 'SECRET \\' PW-TAIL' y",
      "postgres://u:SECRET@PW-TAIL@h/db",
    ] {
      let scrubbed = Secrets.scrub(text)
      #expect(!scrubbed.contains("SECRET") && !scrubbed.contains("PW-TAIL"), "\(text) → \(scrubbed)")
      #expect(Secrets.scrub(scrubbed) == scrubbed)
    }
    #expect(Secrets.scrub(#"host=db password=a\ b dbname=app"#) == "host=db password=[redacted] dbname=app")
  }
}
